package redis_test

import (
	"context"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	// Importing the backend registers redis://, rediss://,
	// redis+sentinel:// and redis+cluster:// with fencelock.Open.
	fencelockredis "github.com/fencelock/fencelock/backend/redis"
)

// Open a client by URL: the scheme picks the backend, the query carries
// both the engine's options (ttl) and the backend's (prefix).
func Example() {
	ctx := context.Background()
	c, err := fencelock.Open(ctx, "redis://localhost:6379/0?ttl=10s&prefix=myapp", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for _, w := range c.Describe().Warnings {
		log.Printf("redis lock safety: %s", w) // e.g. no persistence
	}
	lease, err := c.Acquire(ctx, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	// Hand the token to the resource, which refuses lower ones.
	fmt.Println("holding jobs/nightly with token", lease.Token())
}

// Build the backend on a go-redis client the application already has
// (a *redis.Client, a Sentinel failover client or a *redis.ClusterClient).
// The backend never closes it.
func ExampleNew() {
	ctx := context.Background()
	rdb := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"h1:7000", "h2:7001"}})
	defer rdb.Close()
	b, err := fencelockredis.New(ctx, rdb, &fencelockredis.Options{Prefix: "myapp"})
	if err != nil {
		log.Fatal(err)
	}
	c, err := fencelock.New(b, &fencelock.Options{TTL: 15 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close() // closes b, not rdb
	err = c.Do(ctx, "leader", func(ctx context.Context, l *fencelock.Lease) error {
		// ctx ends the moment leadership is lost.
		<-ctx.Done()
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}
