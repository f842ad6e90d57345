package etcd_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/etcd" // registers etcd:// and etcds://
)

// Open a client by URL, take a lock, and pass its fencing token to the
// protected resource. The URL's path is the key prefix.
func Example() {
	url := os.Getenv("FENCELOCK_TEST_ETCD") // e.g. etcd://127.0.0.1:2379
	if url == "" {
		fmt.Println("set FENCELOCK_TEST_ETCD to run this example")
		return
	}
	ctx := context.Background()
	c, err := fencelock.Open(ctx, url+"/example/", &fencelock.Options{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.Do(ctx, "jobs/nightly", func(ctx context.Context, l *fencelock.Lease) error {
		// ctx is cancelled the moment the lease is lost. Send l.Token()
		// with every write so the resource can refuse a stale holder.
		fmt.Println("holding", l.Key(), "token > 0:", l.Token() > 0)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
