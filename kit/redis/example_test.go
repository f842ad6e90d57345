package redisfence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	redisfence "github.com/fencelock/fencelock/kit/redis"
)

// Credit an account under a lock, fenced: the balance and its history
// change only if the lease's token passes the fencing rule, in the same
// atomic step. Every key carries the resource's hash tag, {acct:1}. The
// example needs a server (FENCELOCK_TEST_REDIS), so it has no checked
// output; TestExample runs it.
func Example() {
	url := os.Getenv("FENCELOCK_TEST_REDIS") // redis://host:6379/0
	if url == "" {
		return
	}
	ctx := context.Background()
	opt, err := redis.ParseURL(url)
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	locks, err := fencelock.New(memory.New(), nil) // any backend
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	err = locks.Do(ctx, "acct:1", func(ctx context.Context, l *fencelock.Lease) error {
		replies, err := redisfence.Do(ctx, rdb, "acct:1", l.Token(), l.Owner(),
			redisfence.Cmd{Name: "INCRBY", Keys: []string{"{acct:1}:balance"}, Args: []any{100}},
			redisfence.Cmd{Name: "RPUSH", Keys: []string{"{acct:1}:history"}, Args: []any{"credit 100"}},
		)
		if err != nil {
			return err
		}
		fmt.Println("balance", replies[0])
		return nil
	})
	if errors.Is(err, fencelock.ErrStaleToken) {
		fmt.Println("refused: a later holder has written")
	} else if err != nil {
		log.Fatal(err)
	}
}
