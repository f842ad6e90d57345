package contender

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"github.com/fencelock/fencelock/safety/fence"
	"github.com/fencelock/fencelock/safety/history"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// running is a contender run in-process on a memory store.
type running struct {
	t     *testing.T
	in    *io.PipeWriter
	fence *fence.Server
	done  chan error

	mu   sync.Mutex
	evs  history.History
	more chan struct{}
}

func startContender(t *testing.T, cfg Config) *running {
	t.Helper()
	dir, err := os.MkdirTemp("", "flct")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	fs, err := fence.Listen(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fence = fs.Addr()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	r := &running{t: t, in: inW, fence: fs, done: make(chan error, 1), more: make(chan struct{})}
	go func() {
		err := Main(cfg, inR, outW)
		outW.Close()
		inR.Close()
		r.done <- err
	}()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			var ev history.Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Errorf("bad event line %q: %v", sc.Text(), err)
				continue
			}
			r.mu.Lock()
			r.evs = append(r.evs, ev)
			close(r.more)
			r.more = make(chan struct{})
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		r.stop()
		<-readDone
		fs.Close()
	})
	return r
}

func (r *running) send(c Command) {
	r.t.Helper()
	b, _ := json.Marshal(c)
	if _, err := r.in.Write(append(b, '\n')); err != nil {
		r.t.Fatal(err)
	}
}

// stop sends OpStop and waits for Main to return (once).
func (r *running) stop() error {
	r.in.Close() // end of stdin is a stop
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(20 * time.Second):
		r.t.Fatal("contender did not stop")
		return nil
	}
}

func (r *running) events() history.History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append(history.History(nil), r.evs...)
}

// await waits until n events match.
func (r *running) await(n int, what string, match func(history.Event) bool) []history.Event {
	r.t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		var got []history.Event
		for _, ev := range r.evs {
			if match(ev) {
				got = append(got, ev)
			}
		}
		more := r.more
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-more:
		case <-deadline.C:
			r.t.Fatalf("waiting for %d %s events, got %d", n, what, len(got))
		}
	}
}

func kind(k history.Kind) func(history.Event) bool {
	return func(ev history.Event) bool { return ev.Kind == k }
}

// TestContenderHistory: a contender takes and releases leases, writes only
// inside its belief (each write after a Belief of its lease, whose Until
// lies ahead), every write is accepted on an uncontended store, and stop
// ends it cleanly.
func TestContenderHistory(t *testing.T) {
	r := startContender(t, Config{Proc: "c1", URL: "mem://contender-history", Keys: []string{"a", "b"}, TTL: 300 * time.Millisecond, Hold: 40 * time.Millisecond})
	r.await(5, "released", kind(history.Released))
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	evs := r.events()
	writes := r.fence.Log()
	if len(writes) == 0 {
		t.Fatal("no writes")
	}
	type leaseState struct {
		acquired, released bool
		lastBelief         history.Event
	}
	leases := map[string]*leaseState{}
	all := append(append(history.History(nil), evs...), writes...)
	all.Sort()
	for _, ev := range all {
		if ev.Proc != "c1" {
			t.Fatalf("event of another process: %+v", ev)
		}
		st := leases[ev.Lease]
		switch ev.Kind {
		case history.Acquired:
			if st != nil {
				t.Fatalf("lease %s acquired twice", ev.Lease)
			}
			if ev.Token == 0 || ev.Until <= ev.T {
				t.Fatalf("bad Acquired %+v", ev)
			}
			leases[ev.Lease] = &leaseState{acquired: true}
		case history.Belief:
			if st == nil || st.released || ev.Until <= ev.T {
				t.Fatalf("Belief outside a held lease: %+v", ev)
			}
			st.lastBelief = ev
		case history.Write:
			if st == nil || st.lastBelief.T == 0 || st.lastBelief.T > ev.T || st.lastBelief.Token != ev.Token {
				t.Fatalf("write without a Belief of its lease before it: %+v", ev)
			}
			if !ev.Accepted {
				t.Fatalf("write rejected on an uncontended store: %+v", ev)
			}
		case history.ReleaseStart:
			if st == nil {
				t.Fatalf("release of an unknown lease: %+v", ev)
			}
			st.released = true
		case history.Lost:
			t.Fatalf("lease lost on a healthy store: %+v", ev)
		}
	}
}

// TestContenderRotationBatchWait: with RotateEvery and several workers,
// a contender's leases rotate their tokens (each rotated token accepted by
// the fence, then the previous one refused), several of its leases are
// renewed in one batch, and workers that find a key held wait through the
// backend's Watcher.
func TestContenderRotationBatchWait(t *testing.T) {
	ttl := 300 * time.Millisecond
	r := startContender(t, Config{Proc: "c1", URL: "mem://contender-rotation", Keys: []string{"a", "b", "c"}, TTL: ttl,
		Hold: 3 * ttl, RotateEvery: ttl / 2, Workers: 4})
	r.await(1, "batch_renew", kind(history.BatchRenew))
	r.await(1, "wait", kind(history.Wait))
	r.await(4, "released", kind(history.Released))
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	batches := 0
	for _, ev := range r.events() {
		if ev.Kind == history.BatchAcquire || ev.Kind == history.BatchRelease {
			batches++
		}
		if ev.Kind == history.BatchRenew && (ev.N < 2 || ev.Err != "") {
			t.Errorf("bad batch: %+v", ev)
		}
		if ev.Kind == history.Wait && (ev.Note != "watch" || ev.Key == "") {
			t.Errorf("bad wait: %+v (the memory backend is a Watcher)", ev)
		}
	}
	t.Logf("%d coalesced acquire or release batches", batches)
	// Per lease: the highest token the fence accepted so far.
	high := map[string]uint64{}
	rotated, probes := 0, 0
	for _, w := range r.fence.Log() {
		h := high[w.Lease]
		switch {
		case w.Token > h && h != 0:
			rotated++
			if !w.Accepted {
				t.Errorf("rotated token refused: %+v", w)
			}
		case w.Token < h:
			probes++
			if w.Accepted {
				t.Errorf("pre-rotation token accepted after the rotated one: %+v", w)
			}
		}
		if w.Accepted && w.Token > h {
			high[w.Lease] = w.Token
		}
	}
	if rotated == 0 || probes == 0 {
		t.Fatalf("%d rotated writes, %d writes with a pre-rotation token; want some of each", rotated, probes)
	}
}

// TestStaleRelease: a stale release of an ended lease reaches the store and
// is refused there; the newer holder keeps its lease.
func TestStaleRelease(t *testing.T) {
	r := startContender(t, Config{Proc: "c1", URL: "mem://contender-stale", Keys: []string{"a"}, TTL: 300 * time.Millisecond, Hold: 40 * time.Millisecond})
	r.await(2, "released", kind(history.Released))
	r.send(Command{Op: OpStale, Stale: "release"})
	r.send(Command{Op: OpStale, Stale: "renew"})
	ops := r.await(2, "stale_op", kind(history.StaleOp))
	for _, op := range ops {
		if op.Lease == "" || op.Token == 0 || !strings.Contains(op.Err, "not held") {
			t.Fatalf("stale %s: %+v (want a refused op on an old lease)", op.Note, op)
		}
	}
	if ops[0].Note != "release" || ops[1].Note != "renew" {
		t.Fatalf("stale ops %q, %q", ops[0].Note, ops[1].Note)
	}
}

// TestResolveRejects: an incomplete Config is an error, not a contender.
func TestResolveRejects(t *testing.T) {
	good := Config{Proc: "c", URL: "mem://x", Keys: []string{"k"}, TTL: time.Second, Fence: "/nowhere"}
	for name, mut := range map[string]func(*Config){
		"proc":    func(c *Config) { c.Proc = "" },
		"url":     func(c *Config) { c.URL = "" },
		"keys":    func(c *Config) { c.Keys = nil },
		"ttl":     func(c *Config) { c.TTL = 0 },
		"fence":   func(c *Config) { c.Fence = "" },
		"mutant":  func(c *Config) { c.Mutant = "nope" },
		"permits": func(c *Config) { c.Permits = -1 },
	} {
		c := good
		mut(&c)
		if err := c.resolve(); err == nil {
			t.Errorf("%s: resolve accepted %+v", name, c)
		}
	}
	c := good
	if err := c.resolve(); err != nil || c.Hold == 0 || c.WriteEvery == 0 || c.AcquireTimeout == 0 {
		t.Fatalf("resolve of a good config: %v, %+v", err, c)
	}
}

// TestEnvRoundTrip: Env and FromEnv carry a Config unchanged.
func TestEnvRoundTrip(t *testing.T) {
	c := Config{Proc: "c1", URL: "redis://127.0.0.1:1/0", Keys: []string{"a", "b"}, TTL: time.Second, Fence: "/tmp/x", Proxy: true, Mutant: MutantExpiry, Seed: 7}
	env, err := c.Env()
	if err != nil {
		t.Fatal(err)
	}
	name, val, _ := strings.Cut(env, "=")
	t.Setenv(name, val)
	got, ok, err := FromEnv()
	if err != nil || !ok {
		t.Fatalf("FromEnv: %v, %v", ok, err)
	}
	if got.Proc != c.Proc || got.URL != c.URL || got.TTL != c.TTL || got.Mutant != c.Mutant || !got.Proxy || len(got.Keys) != 2 {
		t.Fatalf("round trip: %+v", got)
	}
}

// TestDecorateKeepsCapabilities: the decorator offers exactly the optional
// capabilities of the backend it wraps.
func TestDecorateKeepsCapabilities(t *testing.T) {
	b := newRecorder(memory.New(), nil, NoMutant, time.Second, noEmit).decorate()
	defer b.Close()
	if _, ok := b.(driver.Watcher); !ok {
		t.Error("Watcher of the memory backend lost")
	}
	if _, ok := b.(driver.LossNotifier); !ok {
		t.Error("LossNotifier of the memory backend lost")
	}
	if _, ok := b.(driver.Waiter); ok {
		t.Error("Waiter offered, but the memory backend has none")
	}
	if _, ok := b.(driver.BatchRenewer); !ok {
		t.Error("BatchRenewer missing")
	}
	if _, ok := b.(driver.BatchAcquirer); !ok {
		t.Error("BatchAcquirer of the memory backend lost: the engine would not coalesce under the suite")
	}
	if _, ok := b.(driver.BatchReleaser); !ok {
		t.Error("BatchReleaser of the memory backend lost")
	}
	plain := newRecorder(fakebackend.New(memory.New(), fakebackend.Plain).Backend(), nil, NoMutant, time.Second, noEmit).decorate()
	defer plain.Close()
	if _, ok := plain.(driver.BatchAcquirer); ok {
		t.Error("BatchAcquirer offered over a backend without it")
	}
}

func acquire(t *testing.T, b driver.Backend, key, owner string) driver.Grant {
	t.Helper()
	g, err := b.Acquire(context.Background(), driver.AcquireRequest{Key: key, Owner: owner, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestMutantToken: grants report token 1 while the store sees the real
// token (renewal and release still work).
func TestMutantToken(t *testing.T) {
	st := memory.NewStore()
	r := newRecorder(st.Backend(), nil, MutantToken, time.Second, noEmit)
	defer r.Close()
	ctx := context.Background()
	for i := range 3 {
		g := acquire(t, r, "k", "o"+string(rune('a'+i)))
		if g.Token != 1 {
			t.Fatalf("mutant token %d, want 1", g.Token)
		}
		if _, err := r.Renew(ctx, g, driver.RenewRequest{TTL: time.Second}); err != nil {
			t.Fatalf("renew with the mutated token: %v", err)
		}
		if err := r.Release(ctx, g); err != nil {
			t.Fatalf("release with the mutated token: %v", err)
		}
	}
	if st.TokenOf("k") != 3 {
		t.Fatalf("store token %d, want 3", st.TokenOf("k"))
	}
}

// TestMutantExpiry: Renew succeeds although the store no longer holds the
// grant.
func TestMutantExpiry(t *testing.T) {
	st := memory.NewStore()
	r := newRecorder(st.Backend(), nil, MutantExpiry, time.Second, noEmit)
	defer r.Close()
	g := acquire(t, r, "k", "o1")
	st.Expire("k")
	if _, err := r.Renew(context.Background(), g, driver.RenewRequest{TTL: time.Second}); err != nil {
		t.Fatalf("mutant Renew: %v", err)
	}
	res, err := r.RenewBatch(context.Background(), []driver.Grant{g}, driver.RenewRequest{TTL: time.Second})
	if err != nil || res[0].Err != nil {
		t.Fatalf("mutant RenewBatch: %v %+v", err, res)
	}
	if info, _ := r.Inspect(context.Background(), "k"); info.Locked() {
		t.Fatal("the store was renewed")
	}
}

// TestMutantRelease: a stale release frees the current holder's lock.
func TestMutantRelease(t *testing.T) {
	st := memory.NewStore()
	r := newRecorder(st.Backend(), nil, MutantRelease, time.Second, noEmit)
	defer r.Close()
	old := acquire(t, r, "k", "old")
	st.Expire("k")
	acquire(t, r, "k", "new")
	if err := r.Release(context.Background(), old); err != nil {
		t.Fatalf("stale mutant release: %v", err)
	}
	if info, _ := r.Inspect(context.Background(), "k"); info.Locked() {
		t.Fatalf("newer holder still holds: %+v", info)
	}
}

// TestMutantRenewAfterRelease: after Release the record stays and is kept
// alive past its TTL; Close stops the renewals.
func TestMutantRenewAfterRelease(t *testing.T) {
	st := memory.NewStore()
	const ttl = 100 * time.Millisecond
	r := newRecorder(st.Backend(), nil, MutantRenewAfterRelease, ttl, noEmit)
	g, err := r.Acquire(context.Background(), driver.AcquireRequest{Key: "k", Owner: "o1", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(context.Background(), g); err != nil {
		t.Fatalf("mutant release: %v", err)
	}
	time.Sleep(3 * ttl) // the record must outlive its TTL
	info, _ := r.Inspect(context.Background(), "k")
	if info.Owner != "o1" {
		t.Fatalf("after release and 3×TTL: %+v, want still held by o1", info)
	}
	if err := r.Close(); err != nil && !errors.Is(err, driver.ErrClosed) {
		t.Fatal(err)
	}
}

// noEmit discards the decorator's events.
func noEmit(history.Event) {}
