package migrate_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/postgres"
	_ "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/migrate"
)

// world is one migration from Redis to PostgreSQL on the test servers,
// under a Redis prefix and a PostgreSQL table of its own.
type world struct {
	oldURL, newURL string // old and new backend
	base           string // the PostgreSQL server, without the table
	table          string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	r := testenv.URL(t, "FENCELOCK_TEST_REDIS")
	p := testenv.URL(t, "FENCELOCK_TEST_POSTGRES")
	id := randHex()
	w := &world{base: p, table: "fencelock_migrate_" + id}
	w.oldURL = withParam(t, r, "prefix", "migrate-"+id)
	w.newURL = withParam(t, p, "table", w.table)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pool, err := pgxpool.New(ctx, w.base)
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS "`+w.table+`"; DROP SEQUENCE IF EXISTS "`+w.table+`_token_seq"`); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return w
}

func randHex() string {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func withParam(t *testing.T, raw, k, v string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// The three phases of the runbook, as the URL a client is configured with.
const (
	phase1 = 1 // old only (Redis)
	phase2 = 2 // dual (Redis, then PostgreSQL)
	phase3 = 3 // new only (PostgreSQL)
)

func (w *world) url(phase int) string {
	switch phase {
	case phase1:
		return w.oldURL
	case phase2:
		return migrate.DualURL(w.oldURL, w.newURL)
	default:
		return w.newURL
	}
}

func (w *world) client(t *testing.T, phase int, ttl time.Duration) *fencelock.Client {
	t.Helper()
	c, err := fencelock.Open(t.Context(), w.url(phase), &fencelock.Options{TTL: ttl, Owner: fmt.Sprintf("phase%d", phase)})
	if err != nil {
		t.Fatalf("Open(phase %d): %v", phase, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (w *world) backend(t *testing.T, phase int) driver.Backend {
	t.Helper()
	b, _, err := fencelock.OpenBackend(t.Context(), w.url(phase))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// resource is the downstream service: a fenced counter per key, which
// also watches for two holders inside their critical sections at once.
type resource struct {
	fence fencelock.Fence

	mu         sync.Mutex
	value      map[string]int // the counter, as read and written back
	done       map[string]int // increments whose critical section completed
	inside     map[string]string
	violations []string
}

func newResource() *resource {
	return &resource{value: map[string]int{}, done: map[string]int{}, inside: map[string]string{}}
}

func (r *resource) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.violations) < 20 {
		r.violations = append(r.violations, fmt.Sprintf(format, args...))
	}
}

// increment is the critical section: enter, read, yield, write back +1.
// Every write is admitted by the fence with the lease's token first.
func (r *resource) increment(key, who string, l *fencelock.Lease) {
	r.mu.Lock()
	if other, ok := r.inside[key]; ok {
		r.mu.Unlock()
		r.fail("key %q: %s entered while %s was inside: two holders", key, who, other)
		return
	}
	r.inside[key] = who
	v := r.value[key]
	r.mu.Unlock()

	runtime.Gosched() // give an overlapping holder the chance to interleave

	if err := r.fence.Admit(key, l); err != nil {
		r.fail("key %q: %s's write with token %d refused: %v (a token went backwards)", key, who, l.Token(), err)
	}
	r.mu.Lock()
	r.value[key] = v + 1
	r.done[key]++
	delete(r.inside, key)
	r.mu.Unlock()
}

// check fails t if any violation was seen or an increment was lost.
func (r *resource) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range r.violations {
		t.Error(v)
	}
	for k, n := range r.done {
		if r.value[k] != n {
			t.Errorf("key %q: counter is %d after %d completed increments: increments were lost", k, r.value[k], n)
		}
	}
}

// hammer runs, for each phase given, two clients configured for it, each
// doing rounds acquire → increment → release over keys; they all run at
// once against the same keys.
func (w *world) hammer(t *testing.T, r *resource, keys []string, rounds int, phases ...int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, ph := range phases {
		for n := range 2 {
			c := w.client(t, ph, 5*time.Second)
			who := fmt.Sprintf("phase-%d client %d", ph, n)
			wg.Go(func() {
				for i := range rounds {
					key := keys[(i+n)%len(keys)]
					l, err := c.Acquire(ctx, key)
					if err != nil {
						r.fail("%s: Acquire(%q): %v", who, key, err)
						return
					}
					r.increment(key, who, l)
					if err := l.Release(ctx); err != nil {
						r.fail("%s: Release(%q): %v", who, key, err)
					}
				}
			})
		}
	}
	wg.Wait()
}

// TestConformanceRedisPostgres runs the shared suite on a Dual of the real
// servers.
func TestConformanceRedisPostgres(t *testing.T) {
	w := newWorld(t)
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) {
			b, _, err := fencelock.OpenBackend(ctx, w.url(phase2))
			return b, err
		},
		TTL: time.Second,
	})
}

// TestMigrationForwardAndBack walks one fleet through the whole runbook
// and back, on the same keys and one downstream fence: 1 → 1+2 → 2 → 2+3
// → 3, then the rollback 3 → 2+3 → 1+2 → 1, copying token floors where
// the runbook says to. In every step clients of adjacent phases run at
// once: never two holders, no lost increment, and the fence never sees a
// token go backwards.
func TestMigrationForwardAndBack(t *testing.T) {
	w := newWorld(t)
	r := newResource()
	keys := []string{"orders", "payments", "ledger/eu", "ledger/us"}
	const rounds = 25
	copyTokens := func(t *testing.T, fromPhase, toPhase int) {
		t.Helper()
		rep, err := migrate.CopyTokens(t.Context(), w.backend(t, fromPhase), w.backend(t, toPhase), "")
		if err != nil {
			t.Fatalf("CopyTokens: %v", err)
		}
		t.Logf("CopyTokens(phase %d → phase %d): %+v", fromPhase, toPhase, rep)
	}
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"phase 1 alone (the Redis era)", func(t *testing.T) { w.hammer(t, r, keys, rounds, phase1) }},
		{"copy tokens Redis→PostgreSQL", func(t *testing.T) { copyTokens(t, phase1, phase3) }},
		{"phases 1+2 (rolling deploy to dual)", func(t *testing.T) { w.hammer(t, r, keys, rounds, phase1, phase2) }},
		{"phase 2 alone", func(t *testing.T) { w.hammer(t, r, keys, rounds, phase2) }},
		{"phases 2+3 (rolling deploy to PostgreSQL)", func(t *testing.T) { w.hammer(t, r, keys, rounds, phase2, phase3) }},
		{"phase 3 alone (the PostgreSQL era)", func(t *testing.T) { w.hammer(t, r, keys, rounds, phase3) }},
		// A key used only in the PostgreSQL era: its Redis counter knows
		// nothing of its PostgreSQL tokens until tokens are copied back.
		{"phase 3 on a key new to PostgreSQL", func(t *testing.T) { w.hammer(t, r, []string{"pg-era-only"}, rounds, phase3) }},
		{"rollback: phases 2+3", func(t *testing.T) { w.hammer(t, r, keys, rounds, phase2, phase3) }},
		{"copy tokens PostgreSQL→Redis", func(t *testing.T) { copyTokens(t, phase3, phase1) }},
		{"rollback: phases 1+2", func(t *testing.T) { w.hammer(t, r, append(keys, "pg-era-only"), rounds, phase1, phase2) }},
		{"rollback: phase 1 alone", func(t *testing.T) { w.hammer(t, r, append(keys, "pg-era-only"), rounds, phase1) }},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			break
		}
		r.check(t)
		if t.Failed() {
			t.Fatalf("stopped after step %q", s.name)
		}
	}
	for _, k := range append(keys, "pg-era-only") {
		t.Logf("key %q: %d increments, highest token %d", k, r.done[k], r.fence.Highest(k))
	}
}

// TestFloorRaisedWhileHeld: the cut-over's token copy runs while locks are
// held on the old side and on both; once they are released, the first
// PostgreSQL-only holder's token is above every token the fence has seen.
func TestFloorRaisedWhileHeld(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	r := newResource()
	// A long Redis era: its counters are far ahead of the fresh sequence.
	old := w.backend(t, phase1).(driver.TokenFloorer)
	for _, k := range []string{"held-old", "held-dual"} {
		if err := old.RaiseFloor(ctx, k, 50_000); err != nil {
			t.Fatal(err)
		}
	}
	lOld, err := w.client(t, phase1, 5*time.Second).Acquire(ctx, "held-old")
	if err != nil {
		t.Fatal(err)
	}
	lDual, err := w.client(t, phase2, 5*time.Second).Acquire(ctx, "held-dual")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*fencelock.Lease{lOld, lDual} {
		if err := r.fence.Admit(l.Key(), l); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := migrate.CopyTokens(ctx, w.backend(t, phase1), w.backend(t, phase3), "")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Global || rep.Max < 50_001 {
		t.Fatalf("CopyTokens = %+v: want PostgreSQL's global floor raised to at least 50001", rep)
	}
	// The holders keep their leases and tokens through the copy.
	for _, l := range []*fencelock.Lease{lOld, lDual} {
		if err := r.fence.Admit(l.Key(), l); err != nil || l.Err() != nil {
			t.Fatalf("holder of %q after the copy: fence %v, lease %v", l.Key(), err, l.Err())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pg := w.client(t, phase3, 5*time.Second)
	for _, k := range []string{"held-old", "held-dual"} {
		l, err := pg.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.fence.Admit(k, l); err != nil {
			t.Fatalf("first PostgreSQL-era write to %q: %v (token %d, fence saw %d)", k, err, l.Token(), r.fence.Highest(k))
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Idempotent: a second copy changes nothing that matters and fails
	// nothing.
	if _, err := migrate.CopyTokens(ctx, w.backend(t, phase1), w.backend(t, phase3), ""); err != nil {
		t.Fatalf("re-running CopyTokens: %v", err)
	}
}

// TestLosingABackendEndsDualLeases: in phase 2 a dual lease is lost when
// either real backend stops backing it, never carried on by the other
// side alone.
func TestLosingABackendEndsDualLeases(t *testing.T) {
	const ttl = time.Second
	t.Run("PostgreSQL record taken away", func(t *testing.T) {
		w := newWorld(t)
		l, err := w.client(t, phase2, ttl).Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.backend(t, phase3).(driver.ForceReleaser).ForceRelease(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		awaitLost(t, l, 3*ttl)
	})
	t.Run("Redis record taken away", func(t *testing.T) {
		w := newWorld(t)
		l, err := w.client(t, phase2, ttl).Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.backend(t, phase1).(driver.ForceReleaser).ForceRelease(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		awaitLost(t, l, 3*ttl)
	})
	t.Run("PostgreSQL unavailable", func(t *testing.T) {
		w := newWorld(t)
		l, err := w.client(t, phase2, ttl).Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		// Another session locks the table: every renewal on the
		// PostgreSQL side blocks, as if the server were gone.
		pool, err := pgxpool.New(t.Context(), w.base)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		tx, err := pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(t.Context(), `LOCK TABLE "`+w.table+`" IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		awaitLost(t, l, 3*ttl)
	})
	t.Run("Redis unavailable", func(t *testing.T) {
		w := newWorld(t)
		l, err := w.client(t, phase2, ttl).Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		opt, err := goredis.ParseURL(testenv.URL(t, "FENCELOCK_TEST_REDIS"))
		if err != nil {
			t.Fatal(err)
		}
		rdb := goredis.NewClient(opt)
		defer rdb.Close()
		// The server stops answering every client for 4 TTLs.
		if err := rdb.Do(t.Context(), "CLIENT", "PAUSE", (4 * ttl).Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		defer rdb.Do(context.Background(), "CLIENT", "UNPAUSE")
		awaitLost(t, l, 3*ttl)
	})
}

func awaitLost(t *testing.T, l *fencelock.Lease, within time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(within):
		t.Fatalf("dual lease on %q still held %v after one side stopped backing it", l.Key(), within)
	}
	if !errors.Is(l.Err(), fencelock.ErrLeaseLost) {
		t.Fatalf("dual lease ended with %v, want ErrLeaseLost", l.Err())
	}
	t.Logf("lost: %v", l.Err())
}
