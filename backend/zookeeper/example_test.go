package zookeeper_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/zookeeper"
)

// Open a client on ZooKeeper by URL and take a lock. (It needs a server:
// set FENCELOCK_TEST_ZOOKEEPER=zk://127.0.0.1:2181 to run it.)
func Example() {
	url := os.Getenv("FENCELOCK_TEST_ZOOKEEPER")
	if url == "" {
		return
	}
	ctx := context.Background()
	c, err := fencelock.Open(ctx, url+"/example?session_timeout=10s", &fencelock.Options{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	lease, err := c.Acquire(ctx, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("held with token", lease.Token() > 0)
}
