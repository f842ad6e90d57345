package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
)

// row is what the table holds for a key: the row's version (xmin), owner,
// token, contended flag, whether it is live by the server's clock, and
// metadata.
type row struct {
	xmin      string
	owner     string
	token     int64
	contended bool
	live      bool
	metadata  string
}

func rowOf(t *testing.T, b *postgres.Backend, table, key string) row {
	t.Helper()
	var (
		r  row
		md []byte
	)
	err := b.Pool().QueryRow(ctxT(t), `SELECT xmin::text, owner, token, contended, expires_at > now(), metadata FROM "`+table+`" WHERE key = $1`, key).
		Scan(&r.xmin, &r.owner, &r.token, &r.contended, &r.live, &md)
	if err != nil {
		t.Fatalf("reading the row of %q: %v", key, err)
	}
	r.metadata = string(md)
	return r
}

// released acquires key for owner and releases it: a free row that
// exists, whose next taker goes through the conflict path. It returns
// the released grant.
func released(t *testing.T, b *postgres.Backend, key, owner string) driver.Grant {
	t.Helper()
	ctx := ctxT(t)
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	return g
}

// eachStatement runs f once for each acquire statement, on one Backend
// and table: hinted false is acquireFree, true is acquire (the test sets
// the key's hint before each Acquire).
func eachStatement(t *testing.T, f func(t *testing.T, b *postgres.Backend, table string, hinted bool)) {
	base := testURL(t)
	table := uniqueTable(t, base)
	b := openT(t, withParams(t, base, "table", table))
	for _, hinted := range []bool{false, true} {
		t.Run(fmt.Sprintf("hinted=%v", hinted), func(t *testing.T) { f(t, b, table, hinted) })
	}
}

func lastToken(t *testing.T, b *postgres.Backend, table string) int64 {
	t.Helper()
	var v int64
	if err := b.Pool().QueryRow(ctxT(t), `SELECT last_value FROM "`+table+`_token_seq"`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Acquire sends one of two statements, picked by the Backend's held hint:
// acquireFree (no hint) or acquire (hint). Each answers every state of a
// row the same way: a fresh key, the same owner's retry on its live row,
// a key another owner holds (the holder, its token and time left; the row
// marked contended so that its release notifies), a released row and an
// expired row (a new holder with a token above every earlier one). After
// the call the hint says what the call found.
func TestAcquireStatementsAgree(t *testing.T) {
	eachStatement(t, func(t *testing.T, b *postgres.Backend, table string, hinted bool) {
		ctx := ctxT(t)
		key := fmt.Sprintf("agree-%v", hinted)
		acquire := func(owner string) (driver.Grant, error) {
			t.Helper()
			postgres.SetHeldHint(b, key, hinted)
			g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: time.Minute, Metadata: []byte(owner)})
			if held := errors.Is(err, driver.ErrNotAcquired); (err == nil || held) && postgres.HeldHint(b, key) != held {
				t.Fatalf("after Acquire by %s = %v: held hint %v; want %v", owner, err, !held, held)
			}
			return g, err
		}
		granted := func(owner string, above int64) driver.Grant {
			t.Helper()
			g, err := acquire(owner)
			if err != nil || int64(g.Token) <= above {
				t.Fatalf("Acquire by %s = %+v, %v; want a grant with a token above %d", owner, g, err, above)
			}
			if r := rowOf(t, b, table, key); r.owner != owner || r.token != int64(g.Token) || r.contended {
				t.Fatalf("row after %s's grant = %+v; want owner %s, token %d, not contended", owner, r, owner, g.Token)
			}
			if info, err := b.Inspect(ctx, key); err != nil || string(info.Metadata) != owner {
				t.Fatalf("Inspect after %s's grant = %+v, %v; want its metadata", owner, info, err)
			}
			return g
		}

		a := granted("a", 0)
		if g, err := acquire("a"); err != nil || g.Token != a.Token {
			t.Fatalf("same owner's retry = %+v, %v; want token %d kept", g, err, a.Token)
		}
		_, err := acquire("b")
		var he *driver.HeldError
		if !errors.As(err, &he) || he.Holder.Owner != "a" || he.Holder.Token != a.Token || he.Holder.Remaining <= 0 {
			t.Fatalf("Acquire by b on a's key = %v; want a HeldError naming a, token %d, time left", err, a.Token)
		}
		if r := rowOf(t, b, table, key); !r.contended || r.owner != "a" || r.token != int64(a.Token) {
			t.Fatalf("row after b found it held = %+v; want a's, contended", r)
		}
		if err := b.Release(ctx, a); err != nil {
			t.Fatal(err)
		}
		g := granted("b", int64(a.Token)) // a released row

		if _, err := b.Pool().Exec(ctx, `UPDATE "`+table+`" SET locked_at = now() - interval '1 hour', expires_at = now() - interval '1 minute' WHERE key = $1`, key); err != nil {
			t.Fatal(err)
		}
		granted("c", int64(g.Token)) // an expired row
	})
}

// A Backend's later attempts on a key it found held are read-only: they
// neither rewrite the row nor draw a token (a waiter woken by every
// release, or a caller polling a busy key, costs no write). The first
// attempt, with no hint, marks the row contended.
func TestAttemptsOnAHeldKeyWriteNothing(t *testing.T) {
	base := testURL(t)
	table := uniqueTable(t, base)
	dsn := withParams(t, base, "table", table)
	holder, b := openT(t, dsn), openT(t, dsn)
	ctx := ctxT(t)
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	attempt := func(i int) {
		t.Helper()
		if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: fmt.Sprintf("w%d", i), TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("attempt %d = %v; want ErrNotAcquired", i, err)
		}
	}
	attempt(0)
	first, seq := rowOf(t, b, table, "k"), lastToken(t, b, table)
	if !first.contended || !postgres.HeldHint(b, "k") {
		t.Fatalf("after the first attempt: row %+v, hint %v; want contended and hinted", first, postgres.HeldHint(b, "k"))
	}
	for i := 1; i <= 5; i++ {
		attempt(i)
	}
	if r := rowOf(t, b, table, "k"); r != first {
		t.Errorf("row after five hinted attempts = %+v; want it unchanged, %+v", r, first)
	}
	if s := lastToken(t, b, table); s != seq {
		t.Errorf("sequence after five hinted attempts = %d; want %d (no token drawn)", s, seq)
	}
}

// The hints are bounded: a Backend that finds more keys held than it
// remembers keeps at most MaxHeldHints of them, and a grant clears a
// key's hint.
func TestHeldHintsBounded(t *testing.T) {
	base := testURL(t)
	b := openT(t, withParams(t, base, "table", uniqueTable(t, base)))
	for i := range postgres.MaxHeldHints + 100 {
		postgres.SetHeldHint(b, fmt.Sprint("k", i), true)
	}
	if n := postgres.HeldHints(b); n != postgres.MaxHeldHints {
		t.Fatalf("%d hints after %d held keys; want %d", n, postgres.MaxHeldHints+100, postgres.MaxHeldHints)
	}
	last := fmt.Sprint("k", postgres.MaxHeldHints+99)
	if !postgres.HeldHint(b, last) {
		t.Fatal("the newest key's hint was evicted")
	}
	if _, err := b.Acquire(context.Background(), driver.AcquireRequest{Key: last, Owner: "o", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if postgres.HeldHint(b, last) || postgres.HeldHints(b) != postgres.MaxHeldHints-1 {
		t.Fatalf("after a grant of %s: hint %v, %d hints; want cleared, %d", last, postgres.HeldHint(b, last), postgres.HeldHints(b), postgres.MaxHeldHints-1)
	}
}

// The interleaving the fresh nextval inside takeOver exists for, with
// either statement: an acquisition draws a token for its proposed row,
// then waits for the row lock while another client takes the key over
// and releases it with a later token. The waiting acquisition must not
// take the row with the token it drew first (which is below the other
// client's): its token is drawn again after the lock.
func TestTakeoverTokenDrawnAfterTheRowLock(t *testing.T) {
	eachStatement(t, func(t *testing.T, b *postgres.Backend, table string, hinted bool) {
		ctx := ctxT(t)
		key := fmt.Sprintf("late-%v", hinted)
		released(t, b, key, "first")
		// The other client's takeover and release, as one transaction
		// that holds the row lock while the acquisition waits.
		tx, err := b.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, `SELECT 1 FROM "`+table+`" WHERE key = $1 FOR UPDATE`, key); err != nil {
			t.Fatal(err)
		}
		postgres.SetHeldHint(b, key, hinted)
		type outcome struct {
			g   driver.Grant
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "late", TTL: time.Minute})
			done <- outcome{g, err}
		}()
		awaitT(t, "the acquisition to wait for the row lock", func() bool { return waitingOn(t, b, table) > 0 })
		var other int64
		if err := tx.QueryRow(ctx, `UPDATE "`+table+`" SET owner = 'other', token = nextval('"`+table+`_token_seq"'),
  locked_at = now() - interval '1 second', expires_at = now() - interval '1 second' WHERE key = $1 RETURNING token`, key).Scan(&other); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		o := <-done
		if o.err != nil || int64(o.g.Token) <= other {
			t.Fatalf("the waiting acquisition = %+v, %v; want a grant with a token above the other client's %d", o.g, o.err, other)
		}
	})
}
