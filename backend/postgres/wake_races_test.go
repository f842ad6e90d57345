package postgres_test

// Adversarial review of 3751fdd (acquireFree, the bare upsert sent for keys
// a Backend has not found held; release's NOTIFY moved into RETURNING).
// Every interleaving below is made deterministic with a row lock held by a
// transaction of the test's own (lockRow) and by waiting until the
// statements under test are seen queued behind it in pg_stat_activity
// (waitingOn): PostgreSQL grants a contended row lock to its waiters in
// the order they queued, so the test picks which statement runs first.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
)

type reviewAcquired struct {
	g   driver.Grant
	err error
}

func reviewAcquireAsync(ctx context.Context, b *postgres.Backend, req driver.AcquireRequest) <-chan reviewAcquired {
	ch := make(chan reviewAcquired, 1)
	go func() {
		g, err := b.Acquire(ctx, req)
		ch <- reviewAcquired{g, err}
	}()
	return ch
}

func reviewErrAsync(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// reviewQueued waits until n statements on table wait for a lock.
func reviewQueued(t *testing.T, b *postgres.Backend, table string, n int) {
	t.Helper()
	awaitT(t, fmt.Sprintf("%d statements queued on the row lock", n), func() bool { return waitingOn(t, b, table) >= n })
}

// reviewNotified reports whether a notification for the watched key was
// dispatched to ch, deterministically: it sends a sentinel notification on
// the same channel (the channel defaults to the table's name), waits until
// the sentinel's watcher has it, and then looks at ch without waiting. A
// listener receives notifications in the order their transactions
// committed and dispatches them one at a time, so any notification for
// the key committed before the sentinel has been delivered by then.
func reviewNotified(t *testing.T, b *postgres.Backend, table string, ch <-chan struct{}) bool {
	t.Helper()
	ctx := ctxT(t)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sentinel, err := b.Watch(sctx, "review-sentinel")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pool().Exec(ctx, `SELECT pg_notify($1, 'review-sentinel')`, table); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sentinel:
	case <-time.After(time.Minute):
		t.Fatal("the sentinel notification never arrived")
	}
	select {
	case _, ok := <-ch:
		return ok
	default:
		return false
	}
}

func reviewSetup(t *testing.T) (table string, holder, waiter *postgres.Backend) {
	t.Helper()
	base := testURL(t)
	table = uniqueTable(t, base)
	dsn := withParams(t, base, "table", table)
	return table, openT(t, dsn), openT(t, dsn)
}

// reviewWatch watches key through b until the test ends.
func reviewWatch(t *testing.T, b *postgres.Backend, key string) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	t.Cleanup(cancel)
	ch, err := b.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// reviewInOrder starts first, waits until it is queued on the row lock
// the test holds, then starts second and waits until both are queued:
// PostgreSQL grants the lock in that order once the test lets go.
func reviewInOrder(t *testing.T, b *postgres.Backend, table string, first, second func()) {
	t.Helper()
	first()
	reviewQueued(t, b, table, 1)
	second()
	reviewQueued(t, b, table, 2)
}

// The waiter invariant through the statements' row locks, for the orders
// that are safe with either statement: a contender's attempt and the
// holder's release of a key that no contender has marked yet (contended
// false) meet on the row lock.
//
//   - attempt first (either statement): the attempt marks the row
//     contended under the row lock, so the release, which re-reads the row
//     after the lock, NOTIFYs; the holder's metadata is not touched.
//   - release first, bare upsert: the upsert re-reads the released row
//     after the lock and takes it, with a token above the holder's (no
//     wake-up needed).
//
// (The remaining order, release first with the hinted statement, is
// TestHintedAttemptWokenWhenReleaseOvertakesMark.)
//
// Mutations verified to fail: takeOver's contended `ELSE true END` changed
// to `ELSE l.contended END` (attempt-first/free: no NOTIFY); release's
// `CASE WHEN contended` changed to `CASE WHEN NOT contended` (attempt-first,
// both: no NOTIFY); takeOver's metadata `ELSE l.metadata END` changed to
// `ELSE EXCLUDED.metadata END` (the holder's metadata replaced by the
// contender's); takeOver's token for a free row, `nextval({S})`, changed
// to `l.token` (release-first: the token is reused).
func TestWaiterWokenWhenReleaseMeetsAttempt(t *testing.T) {
	type tc struct {
		hinted       bool
		attemptFirst bool
	}
	for _, c := range []tc{{false, true}, {true, true}, {false, false}} {
		t.Run(fmt.Sprintf("hinted=%v/attemptFirst=%v", c.hinted, c.attemptFirst), func(t *testing.T) {
			table, hb, wb := reviewSetup(t)
			ctx := ctxT(t)
			const key = "race"
			g, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "h", TTL: time.Minute, Metadata: []byte("h-md")})
			if err != nil {
				t.Fatal(err)
			}
			ch := reviewWatch(t, wb, key)
			postgres.SetHeldHint(wb, key, c.hinted)
			unlock := lockRow(t, hb, table, key)
			var (
				acq <-chan reviewAcquired
				rel <-chan error
			)
			attempt := func() {
				acq = reviewAcquireAsync(ctx, wb, driver.AcquireRequest{Key: key, Owner: "w", TTL: time.Minute, Metadata: []byte("w-md")})
			}
			release := func() { rel = reviewErrAsync(func() error { return hb.Release(ctx, g) }) }
			if c.attemptFirst {
				reviewInOrder(t, wb, table, attempt, release)
			} else {
				reviewInOrder(t, wb, table, release, attempt)
			}
			unlock()
			a := <-acq
			if err := <-rel; err != nil {
				t.Fatalf("the holder's Release = %v", err)
			}
			if c.attemptFirst {
				var he *driver.HeldError
				if !errors.As(a.err, &he) || he.Holder.Owner != "h" || he.Holder.Token != g.Token {
					t.Fatalf("the attempt queued before the release = %+v, %v; want a HeldError naming h, token %d", a.g, a.err, g.Token)
				}
				if !reviewNotified(t, wb, table, ch) {
					t.Fatal("the contender found the key held, but the holder's release did not NOTIFY")
				}
				return
			}
			if a.err != nil || a.g.Token <= g.Token {
				t.Fatalf("the attempt queued after the release = %+v, %v; want a grant with a token above %d", a.g, a.err, g.Token)
			}
			if r := rowOf(t, wb, table, key); r.owner != "w" || r.token != int64(a.g.Token) || !r.live || r.contended || r.metadata != "w-md" {
				t.Fatalf("row after w's grant = %+v", r)
			}
		})
	}
	// The holder's metadata survives a contender's bare upsert.
	t.Run("metadata", func(t *testing.T) {
		table, hb, wb := reviewSetup(t)
		ctx := ctxT(t)
		if _, err := hb.Acquire(ctx, driver.AcquireRequest{Key: "md", Owner: "h", TTL: time.Minute, Metadata: []byte("h-md")}); err != nil {
			t.Fatal(err)
		}
		if _, err := wb.Acquire(ctx, driver.AcquireRequest{Key: "md", Owner: "w", TTL: time.Minute, Metadata: []byte("w-md")}); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("contender's Acquire = %v; want ErrNotAcquired", err)
		}
		if r := rowOf(t, wb, table, "md"); r.owner != "h" || r.metadata != "h-md" || !r.contended {
			t.Fatalf("row after the contender's bare upsert = %+v; want h's, its metadata, contended", r)
		}
		if info, err := wb.Inspect(ctx, "md"); err != nil || info.Owner != "h" || string(info.Metadata) != "h-md" {
			t.Fatalf("Inspect = %+v, %v; want h with h-md", info, err)
		}
	})
}

// The defect this pins down predates 3751fdd, which kept it on the path a
// waiter's retries take. A Backend whose last attempt found the key held
// sends acquire, which answers a held key from its statement's snapshot
// (cur) and marks the row contended with m only if the row is still held
// after m's row lock. When the holder's release is queued on the row lock
// ahead of m, and the row is not yet contended (a fresh holder: a grant
// resets the flag), the release commits first and sends no NOTIFY (nobody
// had marked the row); m, re-reading the released row, marks nothing; and
// the attempt answered "held by h" from its snapshot: the waiter slept for
// its backoff or the holder's remaining time, not until the release. Now
// acquire reports that it could not mark the row, and Acquire asks again
// with acquireFree, which decides under the row lock: here it takes the
// released row. Without that retry (as on 3e4f5ad) the test fails.
//
// In the engine this is a waiter woken by one holder's release whose
// retry meets the next holder (who took the key first) just as that
// holder releases.
func TestHintedAttemptWokenWhenReleaseOvertakesMark(t *testing.T) {
	table, hb, wb := reviewSetup(t)
	ctx := ctxT(t)
	const key = "race"
	g, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ch := reviewWatch(t, wb, key)
	postgres.SetHeldHint(wb, key, true) // wb found the key held before (by an earlier holder)
	unlock := lockRow(t, hb, table, key)
	var (
		rel <-chan error
		acq <-chan reviewAcquired
	)
	reviewInOrder(t, wb, table,
		func() { rel = reviewErrAsync(func() error { return hb.Release(ctx, g) }) },
		func() {
			acq = reviewAcquireAsync(ctx, wb, driver.AcquireRequest{Key: key, Owner: "w", TTL: time.Minute})
		})
	unlock()
	a := <-acq
	if err := <-rel; err != nil {
		t.Fatalf("the holder's Release = %v", err)
	}
	if a.err == nil {
		return // granted: nothing to wait for
	}
	var he *driver.HeldError
	if !errors.As(a.err, &he) {
		t.Fatalf("attempt = %v", a.err)
	}
	notified := reviewNotified(t, wb, table, ch)
	r := rowOf(t, wb, table, key)
	if !notified {
		t.Fatalf("the attempt found the key held (HeldError naming %q, token %d, %v left) but the holder's release, "+
			"which committed before the attempt returned, sent no NOTIFY (row now: live=%v contended=%v): the waiter is not woken",
			he.Holder.Owner, he.Holder.Token, he.Holder.Remaining, r.live, r.contended)
	}
}

// Sweep's DELETE and an acquisition of the same free row meet on the row
// lock, with either statement.
//
//   - attempt first: the takeover moves expires_at into the future, and
//     Sweep's DELETE, re-checking its WHERE on the row after the lock,
//     skips it: the new holder's row survives (mutual exclusion).
//   - Sweep first: the attempt finds the row gone after the lock and
//     inserts, with the token its statement drew before waiting, which is
//     still above the swept holder's (that row was committed before the
//     attempt began).
//
// Mutations verified to fail: takeOver's expires_at for a taken row,
// `EXCLUDED.expires_at`, changed to `l.expires_at` (attempt first: Sweep
// deletes the new holder's row); acquireFree's VALUES token
// `nextval({S})` changed to `1` (Sweep first, not hinted: the inserted
// token is not above the swept one).
func TestAcquireRacingSweep(t *testing.T) {
	for _, hinted := range []bool{false, true} {
		for _, attemptFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("hinted=%v/attemptFirst=%v", hinted, attemptFirst), func(t *testing.T) {
				table, hb, wb := reviewSetup(t)
				ctx := ctxT(t)
				const key = "swept"
				g := released(t, hb, key, "h")
				if _, err := hb.Pool().Exec(ctx, `UPDATE "`+table+`" SET locked_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE key = $1`, key); err != nil {
					t.Fatal(err)
				}
				postgres.SetHeldHint(wb, key, hinted)
				unlock := lockRow(t, hb, table, key)
				var (
					acq   <-chan reviewAcquired
					swept = make(chan int64, 1)
				)
				attempt := func() {
					acq = reviewAcquireAsync(ctx, wb, driver.AcquireRequest{Key: key, Owner: "w", TTL: time.Minute})
				}
				sweep := func() {
					go func() {
						n, err := hb.Sweep(ctx, postgres.MinSweepAge)
						if err != nil {
							t.Errorf("Sweep: %v", err)
						}
						swept <- n
					}()
				}
				if attemptFirst {
					reviewInOrder(t, wb, table, attempt, sweep)
				} else {
					reviewInOrder(t, wb, table, sweep, attempt)
				}
				unlock()
				a, n := <-acq, <-swept
				if a.err != nil || a.g.Token <= g.Token {
					t.Fatalf("attempt = %+v, %v; want a grant with a token above the swept holder's %d", a.g, a.err, g.Token)
				}
				if want := map[bool]int64{true: 0, false: 1}[attemptFirst]; n != want {
					t.Errorf("Sweep deleted %d rows; want %d", n, want)
				}
				if r := rowOf(t, wb, table, key); r.owner != "w" || r.token != int64(a.g.Token) || !r.live {
					t.Fatalf("row after the race = %+v; want w's live row, token %d", r, a.g.Token)
				}
				if _, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "x", TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
					t.Fatalf("another owner's Acquire while w holds = %v; want ErrNotAcquired", err)
				}
			})
		}
	}
}

// RaiseFloor cannot move the sequence while a bare upsert that has drawn
// its VALUES token is still in flight: the upsert holds the table's ROW
// EXCLUSIVE lock from before its nextval to its commit, and RaiseFloor
// waits for it in LOCK TABLE … SHARE ROW EXCLUSIVE. The next grant after
// the raise is above the floor and above the in-flight grant.
//
// Mutation verified to fail: RaiseFloor without its LOCK TABLE (it then
// returns while the upsert waits on the row lock).
func TestRaiseFloorWaitsForInFlightBareUpsert(t *testing.T) {
	table, hb, wb := reviewSetup(t)
	ctx := ctxT(t)
	const key = "floor"
	g := released(t, hb, key, "h")
	unlock := lockRow(t, hb, table, key)
	acq := reviewAcquireAsync(ctx, wb, driver.AcquireRequest{Key: key, Owner: "w", TTL: time.Minute})
	reviewQueued(t, wb, table, 1)
	floor := driver.Token(int64(g.Token) + 1000)
	raised := reviewErrAsync(func() error { return hb.RaiseFloor(ctx, key, floor) })
	awaitT(t, "RaiseFloor to wait for the in-flight upsert, or to return", func() bool {
		select {
		case err := <-raised:
			t.Fatalf("RaiseFloor returned (%v) while a bare upsert that drew its token was in flight", err)
		default:
		}
		return waitingOn(t, wb, table) >= 2
	})
	unlock()
	a := <-acq
	if err := <-raised; err != nil {
		t.Fatal(err)
	}
	if a.err != nil || a.g.Token <= g.Token {
		t.Fatalf("in-flight attempt = %+v, %v; want a grant above %d", a.g, a.err, g.Token)
	}
	if err := wb.Release(ctx, a.g); err != nil {
		t.Fatal(err)
	}
	next, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "n", TTL: time.Minute})
	if err != nil || next.Token <= floor || next.Token <= a.g.Token {
		t.Fatalf("grant after the raise = %+v, %v; want a token above the floor %d and %d", next, err, floor, a.g.Token)
	}
}

// Release, now one UPDATE with the NOTIFY in its RETURNING: a stale release
// (the right owner with an old token, another owner, or after the lease
// expired) of a contended row changes nothing and notifies nobody; the
// holder's release of an uncontended row frees it without a NOTIFY, and of
// a contended row frees it and NOTIFYs.
//
// Mutations verified to fail: release's `AND token = $3` removed (the old
// token frees the row); `CASE WHEN contended` changed to `CASE WHEN true`
// (an uncontended release notifies).
func TestReleaseNotifiesOnlyForTheReleasedContendedRow(t *testing.T) {
	table, hb, wb := reviewSetup(t)
	ctx := ctxT(t)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Uncontended: freed, no NOTIFY.
	g, err := hb.Acquire(ctx, driver.AcquireRequest{Key: "quiet", Owner: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := wb.Watch(wctx, "quiet")
	if err != nil {
		t.Fatal(err)
	}
	if err := hb.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if r := rowOf(t, wb, table, "quiet"); r.live {
		t.Fatalf("row after release = %+v; want free", r)
	}
	if reviewNotified(t, wb, table, quiet) {
		t.Error("the release of a row no contender had marked sent a NOTIFY")
	}

	// Contended: stale releases change nothing, the holder's notifies.
	g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: "loud", Owner: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g2, err := hb.Renew(ctx, g1, driver.RenewRequest{TTL: time.Minute, Rotate: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wb.Acquire(ctx, driver.AcquireRequest{Key: "loud", Owner: "w", TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("contender's Acquire = %v; want ErrNotAcquired", err)
	}
	loud, err := wb.Watch(wctx, "loud")
	if err != nil {
		t.Fatal(err)
	}
	before := rowOf(t, wb, table, "loud")
	for _, stale := range []driver.Grant{g1, {Key: "loud", Owner: "w", Token: g2.Token}} {
		if err := hb.Release(ctx, stale); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("stale Release(%+v) = %v; want ErrNotHeld", stale, err)
		}
	}
	if after := rowOf(t, wb, table, "loud"); after != before {
		t.Fatalf("row after stale releases = %+v; want it unchanged, %+v", after, before)
	}
	if reviewNotified(t, wb, table, loud) {
		t.Fatal("a stale release sent a NOTIFY")
	}
	if err := hb.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
	if !reviewNotified(t, wb, table, loud) {
		t.Fatal("the release of a contended row sent no NOTIFY")
	}
	// After expiry: the holder's late release changes nothing either.
	g3, err := hb.Acquire(ctx, driver.AcquireRequest{Key: "late", Owner: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hb.Pool().Exec(ctx, `UPDATE "`+table+`" SET locked_at = now() - interval '2 minutes', expires_at = now() - interval '1 minute' WHERE key = 'late'`); err != nil {
		t.Fatal(err)
	}
	before = rowOf(t, wb, table, "late")
	if err := hb.Release(ctx, g3); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release after expiry = %v; want ErrNotHeld", err)
	}
	if after := rowOf(t, wb, table, "late"); after != before {
		t.Fatalf("row after a late release = %+v; want it unchanged, %+v", after, before)
	}
}

// A contender's mark survives the holder's own idempotent retry (the
// engine re-sends Acquire with the same owner after an ambiguous reply),
// through either statement: the retry keeps the token and the contended
// flag, so the holder's release still wakes the contender.
//
// Mutation verified to fail: takeOver's contended for the same owner's
// live row, `THEN l.contended`, changed to `THEN false` (the retry clears
// the mark and the release sends no NOTIFY).
func TestSameOwnerRetryKeepsContendersMark(t *testing.T) {
	for _, hinted := range []bool{false, true} {
		t.Run(fmt.Sprintf("hinted=%v", hinted), func(t *testing.T) {
			table, hb, wb := reviewSetup(t)
			ctx := ctxT(t)
			const key = "retry"
			req := driver.AcquireRequest{Key: key, Owner: "h", TTL: time.Minute, Metadata: []byte("h-md")}
			g, err := hb.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			ch := reviewWatch(t, wb, key)
			if _, err := wb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "w", TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("contender's Acquire = %v; want ErrNotAcquired", err)
			}
			postgres.SetHeldHint(hb, key, hinted)
			again, err := hb.Acquire(ctx, req)
			if err != nil || again.Token != g.Token {
				t.Fatalf("the holder's retry = %+v, %v; want token %d kept", again, err, g.Token)
			}
			if r := rowOf(t, hb, table, key); !r.contended || r.owner != "h" || r.metadata != "h-md" {
				t.Fatalf("row after the holder's retry = %+v; want h's, still contended", r)
			}
			if err := hb.Release(ctx, again); err != nil {
				t.Fatal(err)
			}
			if !reviewNotified(t, wb, table, ch) {
				t.Fatal("the contender's mark was lost: the release sent no NOTIFY")
			}
		})
	}
}
