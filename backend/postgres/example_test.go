package postgres_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/postgres"
)

// Open a client by URL and run a job under a lock. The example needs a
// server (FENCELOCK_TEST_POSTGRES), so it has no checked output.
func Example() {
	dsn := os.Getenv("FENCELOCK_TEST_POSTGRES") // postgres://user@host/db?sslmode=disable
	if dsn == "" {
		return
	}
	ctx := context.Background()
	c, err := fencelock.Open(ctx, dsn, &fencelock.Options{TTL: 15 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.Do(ctx, "jobs/nightly", func(ctx context.Context, l *fencelock.Lease) error {
		// Pass l.Token() with every write; ctx is cancelled if the lease is lost.
		fmt.Println("holding jobs/nightly with token", l.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// The DDL for a DBA, when the application may not create tables.
func ExampleSchema() {
	ddl, err := postgres.Schema("app", "locks")
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(ddl, "\n") {
		if strings.HasPrefix(line, "CREATE") {
			fmt.Println(line)
		}
	}
	// Output:
	// CREATE SEQUENCE IF NOT EXISTS "app"."locks_token_seq" AS bigint MINVALUE 1 NO CYCLE;
	// CREATE TABLE IF NOT EXISTS "app"."locks" (
}
