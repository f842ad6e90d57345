package mysql_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// An acquire that InnoDB ends as a deadlock's victim is asked again, and
// succeeds: the procedure's transaction was rolled back whole, so the
// server's "try restarting transaction" is the answer, not a failure of
// the store (seen with concurrent TryRLocks on a fresh read-write lock,
// one of which failed with Error 1213). The deadlock is made on purpose:
// a larger transaction holds the token counter's row, which the acquire
// waits for while it holds the key's row, which the larger transaction
// then asks for; InnoDB ends the smaller one, the acquire. Mutation
// caught: Acquire returning the deadlock error (acquireAgain without
// errDeadlock).
func TestAcquireEndedAsDeadlockVictimIsAskedAgain(t *testing.T) {
	ctx, b, base, table := openTable(t)
	// The key's row exists, free: the acquire locks it before it draws
	// a token.
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "first", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	db := rawDB(t, base)
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("BEGIN")
	defer conn.ExecContext(context.Background(), "ROLLBACK")
	// Heavier than the acquire's transaction, so that InnoDB picks the
	// acquire as the victim.
	for i := range 50 {
		exec("INSERT INTO `"+table+"` (lock_key, owner, token, locked_at, expires_at) VALUES (?, 'x', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", fmt.Sprintf("other-%02d", i))
	}
	exec("UPDATE `" + table + "_tokens` SET v = v WHERE id = 1")
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Minute})
		done <- err
	}()
	// Await the acquire waiting for the counter's row (a statement on
	// this test's own counter table). InnoDB refreshes
	// what innodb_trx shows only once it has not been read for 100 ms:
	// polled more often, it never changes.
	for waiting := 0; waiting == 0; {
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE ?", "%"+table+"_tokens%").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("Acquire returned (%v) before it waited for the token counter", err)
		case <-time.After(150 * time.Millisecond):
		}
	}
	// Closes the cycle: the acquire holds the key's row.
	exec("SELECT lock_key FROM `" + table + "` WHERE lock_key = 'k' FOR UPDATE")
	exec("ROLLBACK")
	if err := <-done; err != nil {
		t.Fatalf("Acquire ended as a deadlock's victim = %v; want it asked again, and granted", err)
	}
}
