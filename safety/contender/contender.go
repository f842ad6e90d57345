// Package contender is the program a contender process of the safety
// harness runs: a real fencelock client that takes locks, writes to the
// fenced resource while (and only while) it believes it holds them, and
// reports everything it does and believes as history events.
//
// The harness starts contenders as separate processes (see safety/proc),
// so that it can pause one for real with SIGSTOP (a paused goroutine would
// not stop the lease's renewer) or kill it with SIGKILL. The process is a
// re-execution of the running binary (a test binary, or the fencelock
// command): its TestMain or main calls suite.MainIfContender first, which
// calls FromEnv and, when it finds a Config, runs Main instead.
//
// # What a contender does
//
// In a loop: pick a key, Acquire it (or, with Config.Permits, a permit
// of the semaphore on it; with Config.RW, a read or write grant of the
// read-write lock on it: see prims.go) (blocking, bounded by
// Config.AcquireTimeout), then for a while (Config.Hold) write to the
// fenced resource every Config.WriteEvery with the lease's token, each
// write preceded by a check that lease.Remaining() > 0 and a Belief event;
// then Release. A goroutine per lease reports Lost as soon as the lease's
// Done channel closes with a loss. With Config.Workers > 1, that many such
// loops share one client, so a contender holds several leases at once and
// the engine renews them in batches. With Config.RotateEvery, renewals
// rotate the tokens, and after each rotation the holder writes once more
// with its previous token, which the fenced resource must refuse.
//
// The backend decorator also reports how the engine used the backend's
// optional capabilities: a BatchRenew event per batch of two or more
// grants, a BatchAcquire or BatchRelease event per batch of two or more
// coalesced acquire attempts or releases, a Wait event per blocking wait (driver.Waiter) or subscription
// (driver.Watcher).
//
// The backends it can open are those linked into the binary (the
// caller imports their packages; safety/backends links the built-in
// ones).
//
// Its store connection goes through its own in-process faultproxy (the
// host:port of Config.URL is rewritten), so the harness can cut, slow,
// reset or drop replies on exactly this contender's path to the store.
//
// # Protocol
//
// Events go to stdout as history.Event JSON lines (history.Encoder),
// stamped with mono.Now. Commands come from stdin as Command JSON lines;
// stdin's end is a stop command.
package contender

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/faultproxy"
	"github.com/fencelock/fencelock/recipe"
	"github.com/fencelock/fencelock/safety/fence"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/mono"
)

// EnvVar is the environment variable that carries a contender's Config,
// as JSON, into a re-executed test binary.
const EnvVar = "FENCELOCK_SAFETY_CONTENDER"

// Config configures one contender process. Zero durations mean the
// documented defaults.
type Config struct {
	// Proc names the process in its events ("c1", …). Required.
	Proc string `json:"proc"`
	// URL is the store's URL (fencelock.OpenBackend), with a single
	// host:port. Required.
	URL string `json:"url"`
	// Keys are the lock keys the contender takes, one at a time, picked
	// at random. Required.
	Keys []string `json:"keys"`
	// TTL is the lease TTL (fencelock.Options.TTL). Required.
	TTL time.Duration `json:"ttl"`
	// Fence is the fenced resource's address (fence.Server.Addr).
	// Required.
	Fence string `json:"fence"`
	// Proxy routes the store connection through an in-process
	// faultproxy, which the harness controls with commands.
	Proxy bool `json:"proxy,omitempty"`
	// Mutant, if set, breaks the backend on purpose (negative controls).
	Mutant Mutant `json:"mutant,omitempty"`
	// Hold is the longest a lease is held: each is held for a random
	// time in [Hold/2, Hold]. Default TTL/4.
	Hold time.Duration `json:"hold,omitempty"`
	// WriteEvery is the pause between two writes of a holder. Default
	// 5ms.
	WriteEvery time.Duration `json:"write_every,omitempty"`
	// Idle is the longest pause between a release and the next acquire
	// (random in [0, Idle]). Default TTL/10.
	Idle time.Duration `json:"idle,omitempty"`
	// AcquireTimeout bounds one Acquire call. Default 5×TTL.
	AcquireTimeout time.Duration `json:"acquire_timeout,omitempty"`
	// Seed seeds the contender's random choices.
	Seed uint64 `json:"seed,omitempty"`
	// RotateEvery, if positive, is the engine's Options.RotateEvery: a
	// held lease's token is rotated (raised) by its renewals at least
	// this often. After each rotation it observes, the contender first
	// writes with the new token and then once more with the token it
	// had before (a probe the fenced resource must refuse; it is not
	// preceded by a Belief event).
	RotateEvery time.Duration `json:"rotate_every,omitempty"`
	// Workers is how many leases the contender may hold at once: that
	// many loops of acquire, hold and release run side by side on one
	// client, so that the engine renews several leases together (a
	// driver.BatchRenewer batch). Default 1.
	Workers int `json:"workers,omitempty"`
	// Permits, if positive, makes each key the key of a semaphore of that
	// many permits (recipe.NewSemaphore): the contender takes a
	// permit instead of the lock, and writes with the permit's slot key
	// and token (see prims.go).
	Permits int `json:"permits,omitempty"`
	// RW makes each key a read-write lock (recipe.NewRWLock): a
	// round takes the write grant one time in three (the second, fifth,
	// … round of each worker, so that even a slow store sees writers
	// early), else a read grant,
	// and reads or writes the fenced resource named by the lock's key
	// with the grant's token (see prims.go).
	RW bool `json:"rw,omitempty"`
	// Upgrade, with RW, makes a round that is not a writer's an
	// upgradeable read that upgrades one time in two (each worker's
	// first, fourth, … round: recipe.RWLock.UpgradeableRLock, then
	// RWGrant.Upgrade; see prims.go).
	Upgrade bool `json:"upgrade,omitempty"`
	// Multi, if at least 2, makes each round take a set of 2 to Multi
	// distinct keys of Keys, picked at random, all or nothing
	// (recipe.AcquireAll, or every second round TryAcquireAll), and
	// write to every key's fenced resource with that key's token (see
	// prims.go). It needs Workers 1.
	Multi int `json:"multi,omitempty"`
	// MinHold is the engine's Options.MinHold: a lease released sooner
	// keeps its key until MinHold after it was acquired. Default 0.
	MinHold time.Duration `json:"min_hold,omitempty"`
	// LockDelay is the engine's Options.LockDelay: a key whose holder's
	// lease ended without a release is not granted again until LockDelay
	// after that end. Default 0.
	LockDelay time.Duration `json:"lock_delay,omitempty"`
	// Peer, if set, names a lock library other than fencelock that the
	// contender runs instead (suite.Peer): the binary's own hook, before
	// suite.MainIfContender, runs it. Main refuses such a Config.
	Peer string `json:"peer,omitempty"`
}

func (c *Config) resolve() error {
	switch {
	case c.Proc == "":
		return errors.New("contender: Config.Proc is empty")
	case c.URL == "":
		return errors.New("contender: Config.URL is empty")
	case len(c.Keys) == 0:
		return errors.New("contender: Config.Keys is empty")
	case c.TTL <= 0:
		return errors.New("contender: Config.TTL is not positive")
	case c.Fence == "":
		return errors.New("contender: Config.Fence is empty")
	case c.Peer != "":
		return fmt.Errorf("contender: Config.Peer %q: this binary runs fencelock's contender only (a peer library's runs in a binary that links it, such as safety/peers)", c.Peer)
	case !c.Mutant.valid():
		return fmt.Errorf("contender: unknown mutant %q", c.Mutant)
	case c.Permits < 0 || c.Permits > recipe.MaxPermits:
		return fmt.Errorf("contender: Config.Permits %d out of range", c.Permits)
	case c.RW && c.Permits > 0:
		return errors.New("contender: Config.RW and Config.Permits both set")
	case c.Upgrade && !c.RW:
		return errors.New("contender: Config.Upgrade without Config.RW")
	case c.Multi != 0 && (c.Multi < 2 || c.Multi > len(c.Keys)):
		return fmt.Errorf("contender: Config.Multi %d: want 2 to len(Keys) = %d", c.Multi, len(c.Keys))
	case c.Multi != 0 && (c.RW || c.Permits > 0 || c.Workers > 1):
		return errors.New("contender: Config.Multi with Config.RW, Config.Permits or Config.Workers > 1")
	}
	c.FillTimings()
	if c.Workers <= 0 {
		c.Workers = 1
	}
	return nil
}

// FillTimings sets the documented defaults of the timings left zero:
// Hold TTL/4, WriteEvery 5ms, Idle TTL/10, AcquireTimeout 5×TTL. A peer
// library's contender (safety/peers) fills them the same way.
func (c *Config) FillTimings() {
	if c.Hold <= 0 {
		c.Hold = c.TTL / 4
	}
	if c.WriteEvery <= 0 {
		c.WriteEvery = 5 * time.Millisecond
	}
	if c.Idle <= 0 {
		c.Idle = c.TTL / 10
	}
	if c.AcquireTimeout <= 0 {
		c.AcquireTimeout = 5 * c.TTL
	}
}

// Env returns the "NAME=VALUE" environment entry that passes c to a
// re-executed test binary.
func (c Config) Env() (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	return EnvVar + "=" + string(b), nil
}

// FromEnv returns the Config in the environment, if the process is a
// contender (EnvVar is set).
func FromEnv() (Config, bool, error) {
	v, ok := os.LookupEnv(EnvVar)
	if !ok {
		return Config{}, false, nil
	}
	var c Config
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		return Config{}, true, fmt.Errorf("contender: %s: %w", EnvVar, err)
	}
	return c, true, nil
}

// Op is a command's operation.
type Op string

// The commands.
const (
	// OpProxyMode sets the proxy's mode (Command.Mode: "pass",
	// "blackhole", "reset").
	OpProxyMode Op = "proxy_mode"
	// OpLatency sets the proxy's added latency per chunk
	// (Command.Latency; 0 removes it).
	OpLatency Op = "latency"
	// OpDropAcquire drops the reply of the store round trip of the next
	// acquire: the request reaches the store, the reply is discarded and
	// the connection reset. While the command is pending the contender
	// acquires with TryAcquire (one attempt, which the engine cleans up
	// after when its outcome is unknown) instead of Acquire; the
	// AcquireFailed event of the call that was hit has Ambiguous set
	// (Acquired, should the attempt succeed after all). Calls whose
	// request was not the one hit keep the command pending.
	OpDropAcquire Op = "drop_acquire"
	// OpDropRelease does the same for the next Release (its Released
	// event has Ambiguous set).
	OpDropRelease Op = "drop_release"
	// OpPauseBeforeWrite makes the contender stop itself (SIGSTOP) right
	// after the Belief event of its next write, before the write is sent,
	// as a process pause (GC, swap) between the lease check and the write
	// would. It emits a Pause event first; the harness resumes it.
	OpPauseBeforeWrite Op = "pause_before_write"
	// OpStale sends a Release or Renew (Command.Stale: "release",
	// "renew") for the contender's last lost lease (or, if none was
	// lost, its last ended one) straight to the backend, and emits a
	// StaleOp event.
	OpStale Op = "stale"
	// OpStop releases what the contender holds and ends the process.
	OpStop Op = "stop"
)

// Command is one line the harness sends to a contender.
type Command struct {
	Op      Op            `json:"op"`
	Mode    string        `json:"mode,omitempty"`
	Latency time.Duration `json:"latency,omitempty"`
	Stale   string        `json:"stale,omitempty"`
}

// Main runs a contender until it is told to stop (OpStop or the end of
// stdin): events to stdout, commands from stdin. It returns an error if
// the contender could not start.
func Main(cfg Config, stdin io.Reader, stdout io.Writer) error {
	if err := cfg.resolve(); err != nil {
		return err
	}
	k := &contender{cfg: cfg, out: history.NewEmitter(cfg.Proc, stdout)}
	if err := k.open(); err != nil {
		k.closeAll()
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range cfg.Workers {
		w := &worker{k: k, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(os.Getpid())<<8|uint64(i)))}
		if i == 0 {
			w.fc, k.fc = k.fc, nil
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx)
			if w.fc != nil {
				w.fc.Close()
			}
		}()
	}
	k.commands(ctx, stdin) // returns on OpStop or end of stdin
	stop()
	wg.Wait()
	k.closeAll()
	return k.out.Err()
}

type contender struct {
	cfg   Config
	out   *history.Emitter
	proxy *faultproxy.Proxy
	rec   *recorder
	cli   *fencelock.Client
	fc    *fence.Client // dialled by open, then handed to the first worker

	mu           sync.Mutex
	seq          int
	dropAcquire  bool
	dropRelease  bool
	pauseNext    bool
	lastEnded    *ended // the last lease that ended, and the last one lost
	lastLost     *ended
	leaseWatches sync.WaitGroup
}

// ended is a lease that ended, for stale operations.
type ended struct {
	id, key, owner string
}

// open connects everything: proxy, backend, client, fence.
func (k *contender) open() error {
	cfg := k.cfg
	rawURL := cfg.URL
	if cfg.Proxy {
		u, err := url.Parse(cfg.URL)
		if err != nil {
			return fmt.Errorf("contender: URL: %w", err)
		}
		host := u.Host
		if _, _, err := net.SplitHostPort(host); err != nil {
			return fmt.Errorf("contender: URL host %q is not a single host:port", host)
		}
		p, err := faultproxy.Listen(host)
		if err != nil {
			return err
		}
		k.proxy = p
		u.Host = p.Addr()
		rawURL = u.String()
	}
	// The store may be restarting (a harness fault): try for a while.
	var (
		b    driver.Backend
		opts *fencelock.Options
		err  error
	)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		b, opts, err = fencelock.OpenBackend(ctx, rawURL)
		cancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // pacing retries of a failed connect
	}
	if err != nil {
		return fmt.Errorf("contender: open backend: %w", err)
	}
	k.rec = newRecorder(b, k.proxy, cfg.Mutant, cfg.TTL, k.out.Emit)
	k.rec.stores = cfg.Multi > 0
	opts.TTL = cfg.TTL
	opts.RotateEvery = cfg.RotateEvery
	opts.MinHold = cfg.MinHold
	opts.LockDelay = cfg.LockDelay
	opts.Owner = cfg.Proc
	opts.MaxBackoff = max(cfg.TTL/8, 5*time.Millisecond)
	opts.ReleaseTimeout = 2 * cfg.TTL
	k.cli, err = fencelock.New(k.rec.decorate(), opts)
	if err != nil {
		k.rec.Close()
		k.rec = nil
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k.fc, err = fence.Dial(ctx, cfg.Fence)
	return err
}

func (k *contender) closeAll() {
	if k.cli != nil {
		k.cli.Close() // closes the recorder and the backend
	} else if k.rec != nil {
		k.rec.Close()
	}
	k.leaseWatches.Wait()
	if k.fc != nil { // not handed to a worker
		k.fc.Close()
	}
	if k.proxy != nil {
		k.proxy.Close()
	}
}

// commands reads commands until OpStop or the end of r.
func (k *contender) commands(ctx context.Context, r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var c Command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			fmt.Fprintf(os.Stderr, "contender %s: bad command %q: %v\n", k.cfg.Proc, sc.Text(), err)
			continue
		}
		if c.Op == OpStop {
			return
		}
		k.command(ctx, c)
	}
}

func (k *contender) command(ctx context.Context, c Command) {
	switch c.Op {
	case OpProxyMode:
		m, err := faultproxy.ParseMode(c.Mode)
		if err == nil && k.proxy != nil {
			k.proxy.SetMode(m)
		}
	case OpLatency:
		if k.proxy != nil {
			k.proxy.SetLatency(c.Latency)
		}
	case OpDropAcquire:
		k.mu.Lock()
		k.dropAcquire = true
		k.mu.Unlock()
	case OpDropRelease:
		k.mu.Lock()
		k.dropRelease = true
		k.mu.Unlock()
	case OpPauseBeforeWrite:
		k.mu.Lock()
		k.pauseNext = true
		k.mu.Unlock()
	case OpStale:
		k.stale(ctx, c.Stale)
	default:
		fmt.Fprintf(os.Stderr, "contender %s: unknown command %q\n", k.cfg.Proc, c.Op)
	}
}

// stale sends a Release or Renew of an old grant straight to the backend.
func (k *contender) stale(ctx context.Context, op string) {
	k.mu.Lock()
	old := k.lastLost
	if old == nil {
		old = k.lastEnded
	}
	k.mu.Unlock()
	ev := history.Event{Kind: history.StaleOp, Note: op}
	if old == nil {
		ev.Err = "no old lease"
		k.out.Emit(ev)
		return
	}
	g, ok := k.rec.grant(old.owner)
	if !ok {
		ev.Err = "no grant recorded for " + old.owner
		k.out.Emit(ev)
		return
	}
	ev.Key, ev.Lease, ev.Token = old.key, old.id, uint64(g.Token)
	ev.T = mono.Now() // the operation may take effect from here on
	ctx, cancel := context.WithTimeout(ctx, 2*k.cfg.TTL)
	defer cancel()
	var err error
	switch op {
	case "release":
		err = k.rec.Release(ctx, g)
	case "renew":
		_, err = k.rec.Renew(ctx, g, driver.RenewRequest{TTL: k.cfg.TTL})
	default:
		err = fmt.Errorf("unknown stale op %q", op)
	}
	if err != nil {
		ev.Err = err.Error()
	}
	k.out.Emit(ev)
}

func (k *contender) isSet(flag *bool) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return *flag
}

func (k *contender) clear(flag *bool) {
	k.mu.Lock()
	*flag = false
	k.mu.Unlock()
}

// worker is one loop of the contender: acquire, write while holding,
// release. Config.Workers of them share the contender's client.
type worker struct {
	k   *contender
	rng *rand.Rand
	fc  *fence.Client // nil until dialled
	n   int           // rounds begun
}

// run is the worker's loop: acquire, write while holding, release.
func (w *worker) run(ctx context.Context) {
	for ctx.Err() == nil {
		w.round(ctx)
		sleep(ctx, time.Duration(w.rng.Int64N(int64(w.k.cfg.Idle)+1)))
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// round is one lease: acquire, hold and write, release.
func (w *worker) round(ctx context.Context) {
	k := w.k
	cfg := k.cfg
	key := cfg.Keys[w.rng.IntN(len(cfg.Keys))]
	k.mu.Lock()
	k.seq++
	id := cfg.Proc + "-" + strconv.Itoa(k.seq)
	k.mu.Unlock()

	w.n++
	write := cfg.RW && w.n%3 == 2 // a read-write lock's writer: rounds 2, 5, 8, …
	switch {
	case cfg.Multi > 0:
		w.multiRound(ctx, id)
		return
	case cfg.Upgrade && w.n%3 == 1: // rounds 1, 4, 7, …: upgradeable reads
		w.upgradeRound(ctx, key, id)
		return
	}
	start := w.startKey(key, write)
	k.out.Emit(history.Event{Kind: history.AcquireStart, Key: start, Lease: id})
	cs := &callState{drop: k.isSet(&k.dropAcquire)}
	actx, cancel := context.WithTimeout(withCall(ctx, cs), cfg.AcquireTimeout)
	// With cs.drop, one attempt, so that a dropped reply ends the call
	// (the engine's clean-up of an unknown outcome included) instead of
	// being retried away.
	l, err := w.acquire(actx, key, cs.drop, write)
	cancel()
	if cs.hit {
		k.clear(&k.dropAcquire)
	}
	if err != nil {
		k.out.Emit(history.Event{Kind: history.AcquireFailed, Key: start, Lease: id, Ambiguous: cs.hit, Err: err.Error()})
		return
	}
	key = l.key // a permit's slot key, a read-write grant's lease's key (prims.go)
	now := mono.Now()
	k.out.Emit(history.Event{T: now, Kind: history.Acquired, Key: key, Lease: id, Token: uint64(l.Token()),
		Until: now + int64(l.Remaining()), Ambiguous: cs.hit, Note: l.Owner()})

	e := &ended{id: id, key: key, owner: l.Owner()}
	k.leaseWatches.Add(1)
	go func() {
		defer k.leaseWatches.Done()
		<-l.Done()
		if lerr := l.Err(); lerr != nil {
			// Known as lost before anyone can see the Lost event.
			k.mu.Lock()
			k.lastEnded, k.lastLost = e, e
			k.mu.Unlock()
			k.out.Emit(history.Event{Kind: history.Lost, Key: key, Lease: id, Token: uint64(l.Token()), Err: lerr.Error()})
		}
	}()

	if lost := w.hold(ctx, l, key, id); lost {
		return
	}
	k.mu.Lock()
	k.lastEnded = e
	k.mu.Unlock()

	k.out.Emit(history.Event{Kind: history.ReleaseStart, Key: key, Lease: id, Token: uint64(l.Token())})
	rs := &callState{drop: k.isSet(&k.dropRelease)}
	// A fresh context: a stop must not leave the lock behind.
	rctx, rcancel := context.WithTimeout(withCall(context.Background(), rs), 2*cfg.TTL)
	rerr := l.Release(rctx)
	rcancel()
	if rs.hit {
		k.clear(&k.dropRelease)
	}
	ev := history.Event{Kind: history.Released, Key: key, Lease: id, Token: uint64(l.Token()), Ambiguous: rs.hit}
	if rerr != nil {
		ev.Err = rerr.Error()
	}
	k.out.Emit(ev)
}

// hold writes to the fenced resource while the lease is believed held,
// for the round's hold time. It reports whether the lease was lost.
func (w *worker) hold(ctx context.Context, l held, key, id string) (lost bool) {
	k := w.k
	cfg := k.cfg
	hold := cfg.Hold/2 + time.Duration(w.rng.Int64N(int64(cfg.Hold/2)+1))
	end := time.Now().Add(hold)
	var prev uint64 // the token of the last write
loop:
	for ctx.Err() == nil && time.Now().Before(end) {
		// Stamp first: the belief cannot start after the check.
		t := mono.Now()
		rem := l.Remaining()
		if rem <= 0 {
			// Locally expired: the engine ends the lease at once.
			select {
			case <-l.Done():
			case <-ctx.Done():
			}
			break loop
		}
		tok := uint64(l.Token())
		k.out.Emit(history.Event{T: t, Kind: history.Belief, Key: key, Lease: id, Token: tok, Until: t + int64(rem)})
		k.mu.Lock()
		pause := k.pauseNext
		k.pauseNext = false
		k.mu.Unlock()
		if pause {
			k.out.Emit(history.Event{Kind: history.Pause, Key: key, Lease: id, Token: tok, Note: "self: between lease check and write"})
			stopSelf()
		}
		w.write(ctx, l.resource, id, tok, l.access)
		if prev != 0 && tok > prev {
			// Rotated: the token we had before must now be refused.
			w.write(ctx, l.resource, id, prev, l.access)
		}
		prev = tok
		select {
		case <-l.Done():
		case <-ctx.Done():
		case <-time.After(cfg.WriteEvery):
		}
	}
	return l.Err() != nil
}

// stopSelf stops the process with SIGSTOP before it returns. The signal
// is sent to the calling thread (a signal to the process may be handled
// by another thread while this one runs on for a while), which handles it
// on its way back from the system call.
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Tgkill(unix.Getpid(), unix.Gettid(), unix.SIGSTOP)
}

// write sends one write to the fenced resource (for a read-write lock's
// resource, a read or a write: access); the fence logs it.
func (w *worker) write(ctx context.Context, key, id string, tok uint64, access string) {
	if w.fc == nil {
		ctx2, cancel := context.WithTimeout(ctx, 2*time.Second)
		fc, err := fence.Dial(ctx2, w.k.cfg.Fence)
		cancel()
		if err != nil {
			return
		}
		w.fc = fc
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := w.fc.Access(wctx, key, id, w.k.cfg.Proc, tok, access); err != nil {
		w.fc.Close()
		w.fc = nil
	}
}
