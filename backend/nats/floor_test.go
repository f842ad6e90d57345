package nats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// TestFloorRaiseOutlastsContention: RaiseFloor calls made at once on one
// key, from connections of their own, while a holder takes and releases
// that key in a loop, all return nil: a raise that loses its compare to
// another raise or to a lock write reads again until it lands or finds a
// higher floor in place, within its context. And the next grant is above
// every floor raised.
func TestFloorRaiseOutlastsContention(t *testing.T) {
	u := testURL(t)
	const raisers, raises = 8, 6
	holder := openTest(t, u)
	bs := make([]*Backend, raisers)
	for i := range bs {
		bs[i] = openTest(t, u)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const key = "floor-contended"
	var top atomic.Uint64
	stop := make(chan struct{})
	var hwg sync.WaitGroup
	var holdErr error
	hwg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			g, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: 30 * time.Second})
			if errors.Is(err, driver.ErrNotAcquired) {
				// Its write lost twice to the raises (the
				// driver's Acquire is a single try): take again.
				continue
			}
			if err == nil {
				err = holder.Release(ctx, g)
			}
			if err != nil {
				holdErr = err
				return
			}
		}
	})
	var wg sync.WaitGroup
	errs := make([]error, raisers)
	start := make(chan struct{})
	for i, b := range bs {
		wg.Go(func() {
			<-start
			for n := range raises {
				// Every raise is above the last one of every raiser:
				// none finds its floor already in place and returns
				// without writing.
				floor := driver.Token(uint64(1+n)*100_000 + uint64(i)*1000)
				if err := b.RaiseFloor(ctx, key, floor); err != nil {
					errs[i] = fmt.Errorf("raise %d to %d: %w", n, floor, err)
					return
				}
				for {
					cur := top.Load()
					if uint64(floor) <= cur || top.CompareAndSwap(cur, uint64(floor)) {
						break
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(stop)
	hwg.Wait()
	if holdErr != nil {
		t.Fatalf("holder: %v", holdErr)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("raiser %d: %v", i, err)
		}
	}
	g, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if uint64(g.Token) <= top.Load() {
		t.Fatalf("token %d after floors up to %d were raised; want above them", g.Token, top.Load())
	}
}
