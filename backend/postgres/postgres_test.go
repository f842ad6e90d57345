package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: every Backend and
// Client closed stops what it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func openT(t *testing.T, dsn string) *postgres.Backend {
	t.Helper()
	b, err := postgres.Open(ctxT(t), dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func clientT(t *testing.T, b driver.Backend, o *fencelock.Options) *fencelock.Client {
	t.Helper()
	c, err := fencelock.New(b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tableExists reports whether a relation of that exact name exists.
func tableExists(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(ctxT(t), "SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1)", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// Identifiers are validated before any SQL is built: injection attempts in
// schema, table, sequence and channel names are rejected with
// *driver.InvalidOptionError and nothing is created.
func TestIdentifierValidation(t *testing.T) {
	bad := []string{
		`locks"; DROP TABLE x; --`,
		`locks; DROP TABLE x`,
		`"locks"`,
		`public.locks`,
		`locks'`,
		`1locks`,
		`lo cks`,
		`lock$`,
		`ключ`,
		strings.Repeat("a", 64),
	}
	for _, name := range bad {
		for _, o := range []postgres.Options{{Table: name}, {Schema: name}, {Table: "ok", Sequence: name}, {Table: "ok", Channel: name}} {
			err := o.Validate()
			var ioe *driver.InvalidOptionError
			if !errors.As(err, &ioe) || !errors.Is(err, driver.ErrInvalidOption) {
				t.Errorf("Options%+v.Validate() = %v; want *InvalidOptionError", o, err)
			}
		}
		if _, err := postgres.Schema(name, "locks"); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Schema(%q, locks) = %v; want ErrInvalidOption", name, err)
		}
		if _, err := postgres.Schema("", name); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Schema(\"\", %q) = %v; want ErrInvalidOption", name, err)
		}
	}
	// A table name whose default sequence name would be truncated.
	if err := (&postgres.Options{Table: strings.Repeat("t", 60)}).Validate(); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("60-byte table with the default sequence name: %v; want ErrInvalidOption", err)
	}
	for _, good := range []string{"locks", "_x", "Locks_2", strings.Repeat("a", 63)} {
		if err := (&postgres.Options{Schema: good, Table: good, Sequence: good, Channel: good}).Validate(); err != nil {
			t.Errorf("Validate(%q) = %v; want nil", good, err)
		}
	}
	ddl, err := postgres.Schema("app", "locks")
	if err != nil || !strings.Contains(ddl, `CREATE TABLE IF NOT EXISTS "app"."locks"`) || !strings.Contains(ddl, `"app"."locks_token_seq"`) {
		t.Errorf("Schema(app, locks) = %q, %v", ddl, err)
	}

	// Through Open, against a real server: rejected before anything is
	// sent, and no table named after the attempt appears.
	base := testURL(t)
	victim := uniqueTable(t, base)
	vb := openT(t, withParams(t, base, "table", victim))
	for _, param := range []string{"table", "schema", "sequence", "channel"} {
		attack := victim + `"; DROP TABLE "` + victim + `"; --`
		_, err := postgres.Open(ctxT(t), withParams(t, base, param, attack))
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Open with %s=%q: %v; want ErrInvalidOption", param, attack, err)
		}
	}
	if !tableExists(t, vb.Pool(), victim) {
		t.Fatalf("table %s was dropped by an injection attempt", victim)
	}
	if tableExists(t, vb.Pool(), victim+`"; DROP TABLE "`+victim+`"; --`) {
		t.Fatalf("a table named after the injection attempt was created")
	}
}

// Unknown URL parameters are rejected; passwords never appear in errors.
func TestURLParameters(t *testing.T) {
	base := testURL(t)
	table := uniqueTable(t, base)
	_, err := postgres.Open(ctxT(t), withParams(t, base, "table", table, "tabel", "x"))
	if !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("Open with unknown parameter tabel: %v; want ErrInvalidOption", err)
	}
	_, err = postgres.Open(ctxT(t), withParams(t, base, "table", table, "renew_pool_max_conns", "x"))
	if !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("Open with renew_pool_max_conns=x: %v; want ErrInvalidOption", err)
	}
	// A password for a server that is not there.
	u, _ := url.Parse(base)
	u.User = url.UserPassword("someone", "s3cret-pw")
	u.Host = "127.0.0.1:1"
	_, err = postgres.Open(ctxT(t), withParams(t, u.String(), "connect_timeout", "2"))
	if err == nil {
		t.Fatal("Open on a closed port succeeded")
	}
	if strings.Contains(err.Error(), "s3cret-pw") {
		t.Errorf("error reveals the password: %v", err)
	}
	_, err = postgres.Open(ctxT(t), withParams(t, u.String(), "tabel", "x"))
	if err == nil || strings.Contains(err.Error(), "s3cret-pw") {
		t.Errorf("error for an unknown parameter = %v; want an error without the password", err)
	}
	// Both schemes, through the registry.
	for _, scheme := range []string{"postgres", "postgresql", "PostgreSQL"} {
		v, _ := url.Parse(withParams(t, base, "table", table, "ttl", "2s"))
		v.Scheme = scheme
		c, err := fencelock.Open(ctxT(t), v.String(), nil)
		if err != nil {
			t.Errorf("fencelock.Open(%s://…): %v", scheme, err)
			continue
		}
		if c.Options().TTL != 2*time.Second || c.Describe().Name != "postgres" {
			t.Errorf("fencelock.Open(%s://…): TTL %v, backend %q", scheme, c.Options().TTL, c.Describe().Name)
		}
		c.Close()
	}
}

// skewed is a client clock that is off by a constant.
type skewed time.Duration

func (s skewed) Now() time.Time { return time.Now().Add(time.Duration(s)) }

// Expiry is judged by the server's clock: clients whose clocks are an hour
// ahead or behind neither steal a held lock nor lose their own.
func TestSkewedClientClock(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	ctx := ctxT(t)
	const ttl = time.Second
	ahead := clientT(t, openT(t, dsn), &fencelock.Options{TTL: ttl, Clock: skewed(time.Hour)})
	behind := clientT(t, openT(t, dsn), &fencelock.Options{TTL: ttl, Clock: skewed(-time.Hour)})
	for _, pair := range []struct {
		name          string
		holder, thief *fencelock.Client
	}{{"ahead holds, behind tries", ahead, behind}, {"behind holds, ahead tries", behind, ahead}} {
		l, err := pair.holder.TryAcquire(ctx, "skew")
		if err != nil {
			t.Fatalf("%s: TryAcquire: %v", pair.name, err)
		}
		end := time.Now().Add(3 * ttl)
		for time.Now().Before(end) {
			if tl, err := pair.thief.TryAcquire(ctx, "skew"); err == nil {
				t.Fatalf("%s: the skewed client stole a held lock (token %d)", pair.name, tl.Token())
			} else if !errors.Is(err, fencelock.ErrNotAcquired) {
				t.Fatal(err)
			}
			select {
			case <-l.Done():
				t.Fatalf("%s: holder lost its lease: %v", pair.name, l.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
		info, err := pair.thief.Inspect(ctx, "skew")
		if err != nil || info.Owner != l.Owner() || info.Remaining <= 0 || info.Remaining > ttl {
			t.Errorf("%s: Inspect = %+v, %v; want holder %q with 0 < remaining ≤ %v", pair.name, info, err, l.Owner(), ttl)
		}
		mustRelease(t, l)
	}
	// A crashed holder with a skewed clock is freed on the server's
	// schedule: within TTL, not an hour early or late.
	raw := openT(t, dsn)
	g, err := raw.Acquire(ctx, driver.AcquireRequest{Key: "skew-crash", Owner: "dead", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	var l *fencelock.Lease
	for l == nil {
		l, err = behind.TryAcquire(ctx, "skew-crash")
		if err != nil && !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Since(sent) > 5*ttl {
			t.Fatalf("crashed holder's key not freed within 5×TTL")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if since := time.Since(sent); since < ttl*9/10 {
		t.Errorf("key freed after %v; want ≥ TTL %v", since, ttl)
	}
	if l.Token() <= g.Token {
		t.Errorf("takeover token %d not above %d", l.Token(), g.Token)
	}
	mustRelease(t, l)
}

func mustRelease(t *testing.T, l *fencelock.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release(%q): %v", l.Key(), err)
	}
}

// An application that holds every connection of the main pool does not
// stop renewals: they use their own small pool.
func TestPoolExhaustionDoesNotStopRenewals(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base), "pool_max_conns", "2")
	ctx := ctxT(t)
	const ttl = 600 * time.Millisecond

	check := func(t *testing.T, b *postgres.Backend, appPool *pgxpool.Pool) {
		c := clientT(t, b, &fencelock.Options{TTL: ttl})
		l, err := c.TryAcquire(ctx, "busy/"+t.Name())
		if err != nil {
			t.Fatal(err)
		}
		// The application takes every connection of the main pool.
		var held []interface{ Release() }
		for range appPool.Config().MaxConns {
			conn, err := appPool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, conn)
		}
		select {
		case <-l.Done():
			t.Fatalf("lease lost while the application pool was exhausted: %v", l.Err())
		case <-time.After(4 * ttl):
		}
		for _, h := range held {
			h.Release()
		}
		mustRelease(t, l)
	}
	t.Run("Open", func(t *testing.T) {
		b := openT(t, dsn)
		check(t, b, b.Pool())
	})
	// The control: with renewals sharing the exhausted pool the lease is
	// lost, which is what the dedicated pool prevents.
	t.Run("SharedPoolStarves", func(t *testing.T) {
		b := openT(t, withParams(t, dsn, "renew_pool_max_conns", "0"))
		c := clientT(t, b, &fencelock.Options{TTL: ttl})
		l, err := c.TryAcquire(ctx, "busy/"+t.Name())
		if err != nil {
			t.Fatal(err)
		}
		var held []interface{ Release() }
		for range b.Pool().Config().MaxConns {
			conn, err := b.Pool().Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, conn)
		}
		select {
		case <-l.Done():
			t.Logf("as expected, the lease was lost: %v", l.Err())
		case <-time.After(4 * ttl):
			t.Errorf("lease survived with renewals on an exhausted shared pool: the test cannot tell the pools apart")
		}
		for _, h := range held {
			h.Release()
		}
	})
	t.Run("NewWithRenewPool", func(t *testing.T) {
		app, err := pgxpool.New(ctx, withParams(t, base, "pool_max_conns", "2"))
		if err != nil {
			t.Fatal(err)
		}
		defer app.Close()
		renew, err := pgxpool.New(ctx, withParams(t, base, "pool_max_conns", "1"))
		if err != nil {
			t.Fatal(err)
		}
		defer renew.Close()
		u, _ := url.Parse(dsn)
		b, err := postgres.New(ctx, app, &postgres.Options{Table: u.Query().Get("table"), RenewPool: renew})
		if err != nil {
			t.Fatal(err)
		}
		check(t, b, app)
		// Close (through the client) never closed the caller's pools.
		b.Close()
		if err := app.Ping(ctx); err != nil {
			t.Errorf("caller's pool unusable after Backend.Close: %v", err)
		}
		if err := renew.Ping(ctx); err != nil {
			t.Errorf("caller's renewal pool unusable after Backend.Close: %v", err)
		}
	})
}

// Tokens keep increasing when rows are deleted by Sweep: they come from the
// sequence, not from the row.
func TestTokensMonotonicAfterSweep(t *testing.T) {
	base := testURL(t)
	table := uniqueTable(t, base)
	b := openT(t, withParams(t, base, "table", table))
	ctx := ctxT(t)
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "sweep", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sweep(ctx, time.Second); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("Sweep(1s) = %v; want ErrInvalidOption (below MinSweepAge)", err)
	}
	// Nothing old enough yet.
	if n, err := b.Sweep(ctx, postgres.MinSweepAge); err != nil || n != 0 {
		t.Fatalf("Sweep = %d, %v; want 0 rows", n, err)
	}
	// Age the released row by two minutes, as if time had passed.
	if _, err := b.Pool().Exec(ctx, `UPDATE "`+table+`" SET locked_at = locked_at - interval '2 minutes', expires_at = expires_at - interval '2 minutes'`); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Sweep(ctx, postgres.MinSweepAge); err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want 1 row", n, err)
	}
	var rows int
	if err := b.Pool().QueryRow(ctx, `SELECT count(*) FROM "`+table+`"`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("rows after sweep = %d, %v", rows, err)
	}
	g2, err := b.Acquire(ctx, driver.AcquireRequest{Key: "sweep", Owner: "b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("token after sweep %d not above %d", g2.Token, g.Token)
	}
	// A live row is never swept, however old its lock.
	if _, err := b.Pool().Exec(ctx, `UPDATE "`+table+`" SET locked_at = locked_at - interval '1 day'`); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Sweep(ctx, postgres.MinSweepAge); err != nil || n != 0 {
		t.Fatalf("Sweep removed a live row: %d, %v", n, err)
	}
	if err := b.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
}

// Same-owner re-acquire keeps the token (idempotent retry); release then
// re-acquire, takeover and rotation all move it up.
func TestAcquireSemantics(t *testing.T) {
	base := testURL(t)
	b := openT(t, withParams(t, base, "table", uniqueTable(t, base)))
	ctx := ctxT(t)
	req := driver.AcquireRequest{Key: "k", Owner: "a", TTL: time.Minute}
	g1, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := b.Acquire(ctx, req)
	if err != nil || g2.Token != g1.Token {
		t.Fatalf("same-owner re-acquire = %+v, %v; want token %d kept", g2, err, g1.Token)
	}
	_, err = b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "b", TTL: time.Minute})
	var he *driver.HeldError
	if !errors.As(err, &he) || he.Holder.Owner != "a" || he.Holder.Token != g1.Token || he.Holder.Remaining <= 0 {
		t.Fatalf("Acquire by another owner = %v; want a HeldError naming a, token %d, time left", err, g1.Token)
	}
	g3, err := b.Renew(ctx, g1, driver.RenewRequest{TTL: time.Minute, Rotate: true})
	if err != nil || g3.Token <= g1.Token {
		t.Fatalf("rotate = %+v, %v", g3, err)
	}
	if err := b.Release(ctx, g1); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release with the pre-rotation token = %v; want ErrNotHeld", err)
	}
	if err := b.Release(ctx, g3); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Renew(ctx, g3, driver.RenewRequest{TTL: time.Minute}); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("renew after release = %v; want ErrNotHeld", err)
	}
	g4, err := b.Acquire(ctx, req) // same owner as the released grant: a new grant
	if err != nil || g4.Token <= g3.Token {
		t.Fatalf("re-acquire after release = %+v, %v; want a token above %d", g4, err, g3.Token)
	}
	// Batch renewal: the live grant renews, the stale ones are ErrNotHeld.
	res, err := b.RenewBatch(ctx, []driver.Grant{g1, g4, {Key: "nope", Owner: "x", Token: 1}}, driver.RenewRequest{TTL: time.Minute})
	if err != nil || len(res) != 3 || !errors.Is(res[0].Err, driver.ErrNotHeld) || res[1].Err != nil || res[1].Grant.Token != g4.Token || !errors.Is(res[2].Err, driver.ErrNotHeld) {
		t.Fatalf("RenewBatch = %+v, %v", res, err)
	}
	info, err := b.ForceRelease(ctx, "k")
	if err != nil || info.Owner != "a" || info.Token != g4.Token {
		t.Fatalf("ForceRelease = %+v, %v", info, err)
	}
	if info, err := b.ForceRelease(ctx, "k"); err != nil || info.Locked() {
		t.Fatalf("second ForceRelease = %+v, %v; want free", info, err)
	}
}

// Coalesced batch renewals: many concurrent RenewBatch calls each get
// their own results.
func TestRenewBatchCoalescing(t *testing.T) {
	base := testURL(t)
	b := openT(t, withParams(t, base, "table", uniqueTable(t, base), "renew_pool_max_conns", "1"))
	ctx := ctxT(t)
	const n = 64
	grants := make([]driver.Grant, n)
	for i := range grants {
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: fmt.Sprintf("c/%d", i), Owner: fmt.Sprintf("o%d", i), TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		grants[i] = g
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := []driver.Grant{grants[i], {Key: grants[i].Key, Owner: "stale", Token: grants[i].Token}}
			res, err := b.RenewBatch(ctx, in, driver.RenewRequest{TTL: time.Minute, Rotate: i%2 == 0})
			if err != nil {
				t.Error(err)
				return
			}
			if len(res) != 2 || res[0].Err != nil || res[0].Grant.Key != grants[i].Key || !errors.Is(res[1].Err, driver.ErrNotHeld) {
				t.Errorf("call %d: %+v", i, res)
			}
			if i%2 == 0 && res[0].Grant.Token <= grants[i].Token {
				t.Errorf("call %d rotated to %d, not above %d", i, res[0].Grant.Token, grants[i].Token)
			}
		}()
	}
	wg.Wait()
}

// Watch wakes on release and force-release by another backend, ends with
// its context, and, when the LISTEN connection dies, closes its channel
// (the engine then polls) and reconnects on the next Watch.
func TestWatch(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	w, other := openT(t, dsn), openT(t, dsn)
	ctx := ctxT(t)
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatalf("%s: channel closed; want a wake-up", what)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no wake-up within 10s", what)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	ch, err := w.Watch(wctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	// A release notifies only if a contender has found the key held,
	// as the engine's waiting Acquire has before it watches.
	contend := func() {
		t.Helper()
		if _, err := w.Acquire(ctx, driver.AcquireRequest{Key: "w", Owner: "waiter", TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("contender's Acquire = %v; want ErrNotAcquired", err)
		}
	}
	g, err := other.Acquire(ctx, driver.AcquireRequest{Key: "w", Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	contend()
	if err := other.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	wait(ch, "release")
	// Uncontended: no notification (nobody asked).
	g, err = other.Acquire(ctx, driver.AcquireRequest{Key: "w", Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Log("a spurious wake-up after an uncontended release (allowed, but not expected)")
	case <-time.After(200 * time.Millisecond):
	}
	// Force-release always notifies.
	if _, err := other.Acquire(ctx, driver.AcquireRequest{Key: "w", Owner: "o", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ForceRelease(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	wait(ch, "force-release")
	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			<-ch // a wake-up may have been buffered
		}
	case <-time.After(10 * time.Second):
		t.Fatal("channel not closed after its context ended")
	}

	// Kill the LISTEN session from the server side.
	ch2, err := w.Watch(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Pool().Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-ch2:
		for ok {
			_, ok = <-ch2
		}
	case <-time.After(10 * time.Second):
		t.Fatal("channel not closed after the LISTEN connection died")
	}
	ch3, err := w.Watch(ctx, "w")
	if err != nil {
		t.Fatalf("Watch after the LISTEN connection died: %v", err)
	}
	g, err = other.Acquire(ctx, driver.AcquireRequest{Key: "w", Owner: "o2", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	contend()
	if err := other.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	wait(ch3, "release after reconnect")
	w.Close()
	select {
	case _, ok := <-ch3:
		for ok {
			_, ok = <-ch3
		}
	case <-time.After(10 * time.Second):
		t.Fatal("channel not closed by Close")
	}
	if _, err := w.Watch(ctx, "w"); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Watch after Close = %v; want ErrClosed", err)
	}
}

// SkipCreate leaves DDL to a DBA: a missing table is an error, and the
// DDL from Schema makes it work.
func TestSkipCreate(t *testing.T) {
	base := testURL(t)
	table := uniqueTable(t, base)
	ctx := ctxT(t)
	if _, err := postgres.Open(ctx, withParams(t, base, "table", table, "create_table", "false")); err == nil {
		t.Fatal("Open with create_table=false on a missing table succeeded")
	}
	ddl, err := postgres.Schema("", table)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatalf("running Schema's DDL: %v", err)
	}
	b := openT(t, withParams(t, base, "table", table, "create_table", "false"))
	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
}

// Describe reports settings that weaken fencing.
func TestDescribeWarnings(t *testing.T) {
	base := testURL(t)
	table := uniqueTable(t, base)
	b := openT(t, withParams(t, base, "table", table))
	if w := b.Describe().Warnings; len(w) != 0 {
		t.Logf("warnings on the test server: %q", w)
	}
	weak := openT(t, withParams(t, base, "table", table, "synchronous_commit", "off"))
	found := false
	for _, w := range weak.Describe().Warnings {
		found = found || strings.Contains(w, "synchronous_commit=off")
	}
	if !found {
		t.Errorf("Describe().Warnings = %q; want a synchronous_commit warning", weak.Describe().Warnings)
	}
}

// Backend calls after Close return ErrClosed.
func TestClosed(t *testing.T) {
	base := testURL(t)
	b, err := postgres.Open(ctxT(t), withParams(t, base, "table", uniqueTable(t, base)))
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	ctx := ctxT(t)
	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Second}); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Acquire after Close = %v", err)
	}
	if _, err := b.Inspect(ctx, "k"); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Inspect after Close = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// A URL without pool_max_conns gets a main pool sized for lock traffic
// (DefaultPoolMaxConns), not pgx's max(4, NumCPU); one that sets it gets
// what it asks for. The renewal pool keeps its own size.
func TestURLPoolDefaults(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	want := max(16, 4*runtime.GOMAXPROCS(0))
	if got := postgres.DefaultPoolMaxConns(); int(got) != want {
		t.Errorf("DefaultPoolMaxConns() = %d, want max(16, 4 × GOMAXPROCS) = %d", got, want)
	}
	b := openT(t, dsn)
	if got := b.Pool().Config().MaxConns; int(got) != want {
		t.Errorf("main pool of a URL without pool_max_conns: MaxConns %d, want %d", got, want)
	}
	if got := postgres.RenewPool(b).Config().MaxConns; got != postgres.DefaultRenewPoolConns {
		t.Errorf("renewal pool: MaxConns %d, want %d", got, postgres.DefaultRenewPoolConns)
	}
	b = openT(t, withParams(t, dsn, "pool_max_conns", "3"))
	if got := b.Pool().Config().MaxConns; got != 3 {
		t.Errorf("main pool of a URL with pool_max_conns=3: MaxConns %d, want 3", got)
	}
}
