package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// awaitIdleRenewConn waits (bounded) until the renewal pool has an idle
// connection; pgxpool reports no event when it creates one.
func awaitIdleRenewConn(t *testing.T, p *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Stat().IdleConns() < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("renewal pool has no idle connection after 10s: %+v", p.Stat())
		}
		time.Sleep(5 * time.Millisecond) // polling pool statistics: nothing to await
	}
}

// preparedOn returns the statements prepared on one idle connection of p.
func preparedOn(t *testing.T, ctx context.Context, p *pgxpool.Pool) (pid uint32, stmts []string) {
	t.Helper()
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	rows, err := c.Query(ctx, "SELECT statement FROM pg_prepared_statements", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		stmts = append(stmts, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return c.Conn().PgConn().PID(), stmts
}

// The renewal pool that Open creates keeps a connection ready, with the
// renewal statements prepared, before any lease needs it and again after
// its connection is lost: a renewal never pays for establishing a
// connection. (A fresh connection's first renewal costs several times a
// warm one; on a loaded machine that was a whole lease's validity: the
// safety suite's rotation-batch-wait cell lost a lease whose process
// renewed for the first time while the machine stalled.)
func TestRenewalConnectionIsReadyBeforeItIsNeeded(t *testing.T) {
	base := testURL(t)
	b := openT(t, withParams(t, base, "table", uniqueTable(t, base)))
	ctx := ctxT(t)
	rp := postgres.RenewPool(b)
	if rp == b.Pool() {
		t.Fatal("Open did not create a renewal pool")
	}
	awaitIdleRenewConn(t, rp)
	if n := rp.Stat().NewConnsCount(); n != 1 {
		t.Fatalf("renewal pool opened %d connections before any renewal, want 1", n)
	}
	pid, stmts := preparedOn(t, ctx, rp)
	if len(stmts) != 2 {
		t.Fatalf("renewal connection has %d prepared statements, want the 2 renewal statements: %q", len(stmts), stmts)
	}
	// A renewal uses the ready connection: no new one.
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "ready", Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if n := rp.Stat().NewConnsCount(); n != 1 {
		t.Errorf("the first renewal opened a connection (%d in all)", n)
	}
	// The server ends the renewal connection: the pool replaces it,
	// prepared, without waiting for a renewal to ask.
	if _, err := b.Pool().Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	// The pool finds out when it next uses the connection: the health
	// check on acquire, or the statement failing.
	res, err := b.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: time.Minute})
	if err == nil && res[0].Err != nil {
		err = res[0].Err
	}
	t.Logf("renewal after the connection was terminated: %v", err)
	awaitIdleRenewConn(t, rp)
	pid2, stmts := preparedOn(t, ctx, rp)
	if pid2 == pid || len(stmts) != 2 {
		t.Errorf("after losing its connection the renewal pool has connection %d (was %d) with %d prepared statements", pid2, pid, len(stmts))
	}
}

// Waiters of the same Client (blocking in Acquire on the held key and on
// other keys, through LISTEN) never starve the holder's renewals with the
// pools a URL gives by default: a rotating holder renewed in batches keeps
// its lease for several TTLs.
func TestWaitersDoNotStarveRenewals(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	b := openT(t, dsn)
	const ttl = time.Second
	var renewed, failed sync.Map // owner → count, for the failure message
	obs := fencelock.ObserverFunc(func(e fencelock.Event) {
		switch e.Kind {
		case fencelock.EventRenewed:
			renewed.Store(e.Owner+"/"+fmt.Sprint(e.Token), true)
		case fencelock.EventRenewFailed:
			failed.Store(e.Owner+"/"+fmt.Sprint(e.Token), e.Err)
		}
	})
	c := clientT(t, b, &fencelock.Options{TTL: ttl, RotateEvery: ttl / 2, MaxBackoff: ttl / 8, Observer: obs})
	ctx := ctxT(t)
	// A second lease makes the client renew in batches.
	side, err := c.Acquire(ctx, "side")
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	first := l.Token()
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	const waiters = 16
	for i := range waiters {
		key := "held"
		if i%2 == 1 {
			key = "side"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w, err := c.Acquire(wctx, key); err == nil {
				t.Errorf("waiter acquired %q while it was held", key)
				w.Release(context.Background())
			}
		}()
	}
	hold := time.NewTimer(5 * ttl)
	select {
	case <-l.Done():
		t.Errorf("lease lost while %d waiters waited: %v", waiters, l.Err())
	case <-side.Done():
		t.Errorf("side lease lost while %d waiters waited: %v", waiters, side.Err())
	case <-hold.C:
	}
	hold.Stop()
	stop()
	wg.Wait()
	if l.Token() <= first {
		t.Errorf("token never rotated (%d)", first)
	}
	failed.Range(func(k, v any) bool { t.Logf("renewal failed: %s: %v", k, v); return true })
	mustRelease(t, l)
	mustRelease(t, side)
}
