package mysql_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/driver"
)

// Tokens never go back across a crash of the server: while clients keep
// taking fresh keys (each grant draws a token), the server is killed with
// SIGKILL and started again with its data, and every token issued after
// the restart is above every token a grant acknowledged before it. Three
// rounds, on a MariaDB of the test's own.
func TestTokensSurviveServerKill(t *testing.T) {
	e, u := ownServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := mysql.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const workers = 8
	var seq atomic.Int64
	for round := range 3 {
		var (
			acked atomic.Uint64 // the highest acknowledged token
			n     atomic.Int64
			wg    sync.WaitGroup
			stop  = make(chan struct{})
		)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
					g, err := b.Acquire(cctx, driver.AcquireRequest{Key: fmt.Sprintf("k%d", seq.Add(1)), Owner: fmt.Sprintf("w%d", w), TTL: time.Minute})
					ccancel()
					if err != nil {
						continue // the server is down: a grant not acknowledged
					}
					n.Add(1)
					for {
						old := acked.Load()
						if uint64(g.Token) <= old || acked.CompareAndSwap(old, uint64(g.Token)) {
							break
						}
					}
				}
			}()
		}
		for n.Load() < 50 {
			time.Sleep(5 * time.Millisecond)
		}
		if err := e.Restart(ctx, "mysql"); err != nil { // SIGKILL, then start with its data
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		high := acked.Load()
		// A fresh key's token comes from the counter alone.
		var g driver.Grant
		for {
			g, err = b.Acquire(ctx, driver.AcquireRequest{Key: fmt.Sprintf("after%d", round), Owner: "after", TTL: time.Minute})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("round %d: no acquire after the restart: %v", round, err)
			}
		}
		t.Logf("round %d: %d grants acknowledged before the kill, highest token %d; first token after the restart %d", round, n.Load(), high, g.Token)
		if uint64(g.Token) <= high {
			t.Fatalf("round %d: token %d after a kill -9 and restart is not above %d, acknowledged before it: tokens went back", round, g.Token, high)
		}
	}
}
