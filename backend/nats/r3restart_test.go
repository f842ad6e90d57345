package nats

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/recipe"
)

// TestSemaphoreThroughWholeClusterRestart kills all three members of
// nats3 with SIGKILL and starts them again while clients take and release
// the permits of a semaphore (3 permits, 4 clients of 3 goroutines, each
// holding its permit 1-20 ms), and goes on for 15 s through the cluster's
// recovery. No permit may be handed out with its lease already ended,
// granted while another holder's lease on the same slot is still valid
// (its Done not closed), or with a token not above the slot's previous
// one. It runs FENCELOCK_NATS3_RESTART_ROUNDS rounds (each a restart of
// the whole cluster: about 25 s); unset, it is skipped. The seed of each
// round (the kill's point in the load, the hold time) is logged.
func TestSemaphoreThroughWholeClusterRestart(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("FENCELOCK_NATS3_RESTART_ROUNDS"))
	if rounds <= 0 {
		t.Skip("FENCELOCK_NATS3_RESTART_ROUNDS=N restarts the whole nats3 cluster N times under semaphore load (about 25 s a round)")
	}
	u := testURL(t, "FENCELOCK_TEST_NATS3") + "&connect_timeout=30s"
	restart := testenv.Restart("nats3")
	if restart == nil {
		t.Fatal("FENCELOCK_TEST_NATS3 is not a nats3 that this scripts/testenv state owns: the test restarts it")
	}
	failed := 0
	for r := range rounds {
		seed := rand.Uint64()
		if !semaphoreRestartRound(t, u, restart, seed) {
			failed++
			t.Errorf("round %d (seed %d): a permit was handed out twice or ended", r, seed)
		}
	}
	t.Logf("%d of %d whole-cluster restarts broke the semaphore", failed, rounds)
}

// semaphoreRestartRound runs one round of
// TestSemaphoreThroughWholeClusterRestart; it reports whether the round
// was safe.
func semaphoreRestartRound(t *testing.T, u string, restart func(context.Context) error, seed uint64) bool {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n, clients, workers = 3, 4, 3
	type holding struct {
		l   *fencelock.Lease
		who string
	}
	var (
		mu     sync.Mutex
		slots  = map[string]holding{}         // slot key → its holder now
		last   = map[string]fencelock.Token{} // slot key → highest token granted
		bad    atomic.Bool
		grants atomic.Int64
		begin  = time.Now()
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	opts := &fencelock.Options{TTL: 2 * time.Second, MinBackoff: 2 * time.Millisecond, MaxBackoff: 250 * time.Millisecond, ReleaseTimeout: 10 * time.Second}
	for i := range clients {
		b, err := Open(ctx, u)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		c, err := fencelock.New(b, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sem, err := recipe.NewSemaphore(c, fmt.Sprintf("restart-%d", seed), n)
		if err != nil {
			t.Fatal(err)
		}
		for w := range workers {
			who := fmt.Sprintf("c%d/w%d", i, w)
			hold := time.Duration(rng.IntN(20)+1) * time.Millisecond
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					actx, acancel := context.WithTimeout(ctx, 20*time.Second)
					l, err := sem.Acquire(actx)
					acancel()
					if err != nil {
						continue // the cluster is down or electing: try again
					}
					grants.Add(1)
					at := time.Since(begin)
					mu.Lock()
					select {
					case <-l.Done():
						bad.Store(true)
						t.Errorf("+%v: %s got a permit on %s (token %d) whose lease had ended: %v", at, who, l.Key(), l.Token(), l.Err())
					default:
					}
					if h, ok := slots[l.Key()]; ok {
						select {
						case <-h.l.Done(): // the old holder's lease ended first
						default:
							bad.Store(true)
							t.Errorf("+%v: %s got %s (token %d) while %s holds it (token %d, %v left)", at, who, l.Key(), l.Token(), h.who, h.l.Token(), h.l.Remaining())
						}
					}
					if l.Token() <= last[l.Key()] {
						bad.Store(true)
						t.Errorf("+%v: %s got %s with token %d, not above its previous %d", at, who, l.Key(), l.Token(), last[l.Key()])
					}
					slots[l.Key()], last[l.Key()] = holding{l, who}, max(last[l.Key()], l.Token())
					mu.Unlock()
					select {
					case <-time.After(hold): // the work
					case <-l.Done():
					}
					mu.Lock()
					if h := slots[l.Key()]; h.l == l {
						delete(slots, l.Key())
					}
					mu.Unlock()
					rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
					_ = l.Release(rctx)
					rcancel()
				}
			})
		}
	}
	before := time.Duration(rng.IntN(1500)+200) * time.Millisecond
	time.Sleep(before) // load before the kill, for a random time
	t0 := time.Now()
	err := restart(ctx)
	took := time.Since(t0)
	if err == nil {
		time.Sleep(15 * time.Second) // load through the cluster's recovery
	}
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	t.Logf("seed %d: killed at +%v, serving again after %v; %d permits granted", seed, before, took, grants.Load())
	return !bad.Load()
}
