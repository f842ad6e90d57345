package etcdfence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"

	etcdfence "github.com/fencelock/fencelock/kit/etcd"
)

// Write an account under a lock, fenced: the put lands only if the
// lease's token passes the fencing rule, in the same etcd transaction.
// The URL's path is a key prefix (a namespace), as for the etcd backend.
// The example needs a server (FENCELOCK_TEST_ETCD), so it has no checked
// output; TestExample runs it.
func Example() {
	raw := os.Getenv("FENCELOCK_TEST_ETCD") // e.g. etcd://127.0.0.1:2379/app/
	if raw == "" {
		return
	}
	u, err := url.Parse(raw)
	if err != nil {
		log.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(u.Host, ","), DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	kv := namespace.NewKV(cli.KV, u.Path)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	locks, err := fencelock.New(memory.New(), nil) // any backend
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	err = locks.Do(ctx, "accounts/1", func(ctx context.Context, l *fencelock.Lease) error {
		_, err := etcdfence.Txn(ctx, kv, "accounts/1", l.Token(), l.Owner(),
			clientv3.OpPut("accounts/1", "balance=100"))
		return err
	})
	if errors.Is(err, fencelock.ErrStaleToken) {
		fmt.Println("refused: a later holder has written")
	} else if err != nil {
		log.Fatal(err)
	}
	high, holder, err := etcdfence.Highest(ctx, kv, "accounts/1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("fence", high, holder)
}
