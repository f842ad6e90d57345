package peers

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencelock/fencelock/safety/contender"
	"github.com/fencelock/fencelock/safety/fence"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/mono"
)

// MainIfContender must be called first in the TestMain of a binary that
// runs suite.Run with suite.Peer backends, before suite.MainIfContender:
// when the process is a contender of a peer library (contender.Config
// with Peer set, in contender.EnvVar), it runs that contender and exits
// the process (status 0, or 1 after printing why to stderr); otherwise it
// returns at once.
func MainIfContender() {
	cfg, ok, err := contender.FromEnv()
	if !ok || err != nil || cfg.Peer == "" {
		return // not a contender, or fencelock's (suite.MainIfContender)
	}
	if err := Main(cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "peers: contender %s (%s): %v\n", cfg.Proc, cfg.Peer, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// locker is one library's lock, opened on one store connection.
type locker interface {
	// lock blocks until the contender holds key, or ctx ends. id names
	// the lease in the history.
	lock(ctx context.Context, key, id string) (held, error)
	// close ends the connection (and with it what the library holds).
	close()
}

// held is one lock the library granted.
type held interface {
	// token is the library's fencing token, 0 if it has none.
	token() uint64
	// check is what a careful holder asks before it acts on the lock:
	// how long it may still believe it holds it (≤ 0: not now), and
	// whether the library says the lock is gone (then why).
	check() (rem time.Duration, gone bool, why string)
	// lost is closed when the library tells the holder, unasked, that
	// the lock is gone (nil if it never does).
	lost() <-chan struct{}
	// unlock gives the lock back.
	unlock(ctx context.Context) error
}

// opener opens a library's locker on the store of a contender's URL.
type opener func(cfg contender.Config) (locker, error)

// openers are the libraries a contender can run, by Lib.Name.
var openers = map[string]opener{
	Redsync:   openRedsync,
	Redislock: openRedislock,
	EtcdMutex: openEtcdMutex,
	ZKLock:    openZKLock,
}

// Main runs a peer library's contender (cfg.Peer) until it is told to
// stop (contender.OpStop or the end of stdin): events to stdout,
// commands from stdin. Of the commands only OpPauseBeforeWrite acts; the
// others need fencelock's engine or its proxy and are ignored.
func Main(cfg contender.Config, stdin io.Reader, stdout io.Writer) error {
	open, ok := openers[cfg.Peer]
	switch {
	case !ok:
		return fmt.Errorf("unknown peer library %q (known: %s, %s, %s, %s)", cfg.Peer, Redsync, Redislock, EtcdMutex, ZKLock)
	case cfg.Proc == "" || cfg.URL == "" || len(cfg.Keys) == 0 || cfg.TTL <= 0 || cfg.Fence == "":
		return errors.New("contender.Config needs Proc, URL, Keys, TTL and Fence")
	}
	cfg.FillTimings()
	// The store may be restarting (a harness fault): try for a while.
	var (
		lk  locker
		err error
	)
	deadline := time.Now().Add(30 * time.Second)
	for {
		lk, err = open(cfg)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // pacing retries of a failed connect
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", cfg.Peer, err)
	}
	defer lk.close()
	fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	fc, err := fence.Dial(fctx, cfg.Fence)
	cancel()
	if err != nil {
		return err
	}
	w := &worker{cfg: cfg, lk: lk, fc: fc, out: history.NewEmitter(cfg.Proc, stdout),
		rng: rand.New(rand.NewPCG(cfg.Seed, uint64(os.Getpid())))}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			w.round(ctx)
			sleep(ctx, time.Duration(w.rng.Int64N(int64(cfg.Idle)+1)))
		}
	}()
	w.commands(stdin)
	stop()
	<-done
	w.watches.Wait()
	if w.fc != nil {
		w.fc.Close()
	}
	return w.out.Err()
}

// worker is the contender's loop: acquire, write while believing, release.
type worker struct {
	cfg     contender.Config
	lk      locker
	fc      *fence.Client
	out     *history.Emitter
	rng     *rand.Rand
	seq     int
	watches sync.WaitGroup

	mu        sync.Mutex
	pauseNext bool
}

// commands reads commands until OpStop or the end of r.
func (w *worker) commands(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var c contender.Command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			fmt.Fprintf(os.Stderr, "contender %s: bad command %q: %v\n", w.cfg.Proc, sc.Text(), err)
			continue
		}
		switch c.Op {
		case contender.OpStop:
			return
		case contender.OpPauseBeforeWrite:
			w.mu.Lock()
			w.pauseNext = true
			w.mu.Unlock()
		default:
			fmt.Fprintf(os.Stderr, "contender %s: command %q ignored: a peer library's contender has no engine or proxy\n", w.cfg.Proc, c.Op)
		}
	}
}

// round is one lock: acquire, hold and write, release.
func (w *worker) round(ctx context.Context) {
	cfg := w.cfg
	key := cfg.Keys[w.rng.IntN(len(cfg.Keys))]
	w.seq++
	id := cfg.Proc + "-" + strconv.Itoa(w.seq)
	w.out.Emit(history.Event{Kind: history.AcquireStart, Key: key, Lease: id})
	actx, cancel := context.WithTimeout(ctx, cfg.AcquireTimeout)
	h, err := w.lk.lock(actx, key, id)
	cancel()
	if err != nil {
		w.out.Emit(history.Event{Kind: history.AcquireFailed, Key: key, Lease: id, Err: err.Error()})
		return
	}
	tok := h.token()
	t := mono.Now()
	rem, _, _ := h.check()
	w.out.Emit(history.Event{T: t, Kind: history.Acquired, Key: key, Lease: id, Token: tok, Until: t + int64(max(rem, 0))})

	var once sync.Once
	lostEv := func(why string) {
		once.Do(func() { w.out.Emit(history.Event{Kind: history.Lost, Key: key, Lease: id, Token: tok, Err: why}) })
	}
	ended := make(chan struct{})
	if ch := h.lost(); ch != nil {
		w.watches.Add(1)
		go func() {
			defer w.watches.Done()
			select {
			case <-ch:
				_, _, why := h.check()
				lostEv(why)
			case <-ended:
			}
		}()
	}
	defer close(ended)

	if w.hold(ctx, h, key, id, tok, lostEv) {
		return // gone: nothing to give back
	}
	w.out.Emit(history.Event{Kind: history.ReleaseStart, Key: key, Lease: id, Token: tok})
	// A fresh context: a stop must not leave the lock behind.
	rctx, rcancel := context.WithTimeout(context.Background(), 2*cfg.TTL)
	rerr := h.unlock(rctx)
	rcancel()
	ev := history.Event{Kind: history.Released, Key: key, Lease: id, Token: tok}
	if rerr != nil {
		ev.Err = rerr.Error()
	}
	w.out.Emit(ev)
}

// hold writes to the fenced resource while the holder believes it holds
// the lock, for the round's hold time. It reports whether the library
// said the lock was gone (after reporting Lost).
func (w *worker) hold(ctx context.Context, h held, key, id string, tok uint64, lostEv func(string)) (gone bool) {
	cfg := w.cfg
	hold := cfg.Hold/2 + time.Duration(w.rng.Int64N(int64(cfg.Hold/2)+1))
	end := time.Now().Add(hold)
	for ctx.Err() == nil && time.Now().Before(end) {
		// Stamp first: the belief cannot start after the check.
		t := mono.Now()
		rem, gone, why := h.check()
		if gone {
			lostEv(why)
			return true
		}
		if rem > 0 {
			w.out.Emit(history.Event{T: t, Kind: history.Belief, Key: key, Lease: id, Token: tok, Until: t + int64(rem)})
			w.mu.Lock()
			pause := w.pauseNext
			w.pauseNext = false
			w.mu.Unlock()
			if pause {
				w.out.Emit(history.Event{Kind: history.Pause, Key: key, Lease: id, Token: tok, Note: "self: between lock check and write"})
				stopSelf()
			}
			w.write(ctx, key, id, tok)
		}
		select {
		case <-h.lost():
		case <-ctx.Done():
		case <-time.After(cfg.WriteEvery):
		}
	}
	return false
}

// write sends one write to the fenced resource, which logs it.
func (w *worker) write(ctx context.Context, key, id string, tok uint64) {
	if w.fc == nil {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fc, err := fence.Dial(dctx, w.cfg.Fence)
		cancel()
		if err != nil {
			return
		}
		w.fc = fc
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := w.fc.Write(wctx, key, id, w.cfg.Proc, tok); err != nil {
		w.fc.Close()
		w.fc = nil
	}
}

// stopSelf stops the process with SIGSTOP before it returns (sent to the
// calling thread, as safety/contender does).
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Tgkill(unix.Getpid(), unix.Gettid(), unix.SIGSTOP)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
