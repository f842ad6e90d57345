package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
)

const demoUsage = `
Usage: fencelock demo

A self-contained demonstration, in this process, on the memory backend (no
store, no files): three workers compete for one lock that protects a
resource which checks fencing tokens. The first holder is paused past its
TTL (as a long GC pause or a SIGSTOP would), a new holder takes over with a
higher token, and the resource refuses the paused holder's late write.
It takes about two seconds and prints a timeline.
`

// demoTTL is the demo's lease TTL: short, so the demo is quick, and long
// enough for a busy machine.
const demoTTL = 600 * time.Millisecond

func cmdDemo(e *env, args []string) int {
	fset := e.flagSet("demo", demoUsage, "Example:\n  fencelock demo")
	pos, rest, exit, stop := e.parse(fset, args, 0)
	if stop {
		return exit
	}
	if len(pos) != 0 || len(rest) != 0 {
		return e.usageError("demo", "takes no arguments")
	}
	if err := runDemo(e.stdout, demoTTL); err != nil {
		fmt.Fprintf(e.stderr, "fencelock demo: %v\n", err)
		return exitSoftware
	}
	return exitOK
}

// timeline prints events with their time since the start, one at a time.
type timeline struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (t *timeline) say(who, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at := fmt.Sprintf("+%.2fs", time.Since(t.start).Seconds())
	fmt.Fprintf(t.w, "  %7s  %-9s %s\n", at, who, fmt.Sprintf(format, args...))
}

func runDemo(w io.Writer, ttl time.Duration) error {
	const key = "reports/daily"
	store := memory.NewStore()
	var fence fencelock.Fence // the resource's side: remembers the highest token
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	fmt.Fprintf(w, "Three workers compete for the lock %q (TTL %v) on the memory backend.\n", key, ttl)
	fmt.Fprintf(w, "The lock protects a resource that refuses writes whose fencing token is lower\nthan the highest it has seen.\n\n")
	tl := &timeline{w: w, start: time.Now()}

	var (
		order       atomic.Int32
		takeover    = make(chan struct{}) // the second holder has written
		lateDone    = make(chan struct{}) // the paused holder has tried its late write
		wg          sync.WaitGroup
		errMu       sync.Mutex
		firstErr    error
		rejected    atomic.Bool
		highestSeen atomic.Uint64
		lateChecked atomic.Bool
		firstToken  atomic.Uint64
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		cancel()
	}
	write := func(who string, l *fencelock.Lease, tok fencelock.Token) error {
		err := fence.Check(key, tok, l.Owner())
		if err != nil {
			tl.say(who, "write with token %d REJECTED by the resource: %v", tok, err)
			return err
		}
		tl.say(who, "writes the report with token %d: accepted", tok)
		return nil
	}

	for i := 1; i <= 3; i++ {
		name := "worker-" + strconv.Itoa(i)
		b := store.Backend()
		c, err := fencelock.New(b, &fencelock.Options{TTL: ttl, Owner: name, MaxBackoff: ttl / 4})
		if err != nil {
			return err
		}
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Acquire(ctx, key)
			if err != nil {
				fail(fmt.Errorf("%s: %w", name, err))
				return
			}
			tok := l.Token()
			switch order.Add(1) {
			case 1:
				firstToken.Store(uint64(tok))
				tl.say(name, "acquires the lock: token %d", tok)
				if err := write(name, l, tok); err != nil {
					fail(err)
					return
				}
				// The paused holder's engine keeps its own clock; report
				// when it gives the lease up.
				go func() {
					<-l.Done()
					tl.say(name, "(meanwhile its lease engine, on its own clock, ended the lease: %v; the worker would see that in lease.Done() if it looked)", l.Err())
				}()
				tl.say(name, "is paused (a long GC pause): no renewals reach the store, no checks")
				b.SetUnreachable(true)
				select {
				case <-takeover:
				case <-ctx.Done():
					return
				}
				time.Sleep(ttl / 6) // the pause lasts a little longer
				b.SetUnreachable(false)
				tl.say(name, "resumes, still thinks it holds the lock, and writes with token %d", tok)
				highestSeen.Store(uint64(fence.Highest(key)))
				if err := write(name, l, tok); err != nil {
					rejected.Store(true)
				}
				lateChecked.Store(true)
				close(lateDone)
			case 2:
				tl.say(name, "acquires the lock after the paused holder's lease expired: token %d", tok)
				if err := write(name, l, tok); err != nil {
					fail(err)
					return
				}
				close(takeover)
				select {
				case <-lateDone:
				case <-ctx.Done():
					return
				}
				l.Release(ctx)
				tl.say(name, "releases the lock")
			case 3:
				tl.say(name, "acquires the lock: token %d", tok)
				if err := write(name, l, tok); err != nil {
					fail(err)
					return
				}
				l.Release(ctx)
				tl.say(name, "releases the lock")
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if !lateChecked.Load() || !rejected.Load() {
		return fmt.Errorf("the paused holder's late write was not rejected")
	}
	fmt.Fprintf(w, "\nThe lock alone could not stop the paused worker: it never looked at its lease\nbefore writing. The fencing token did: the resource had seen token %d and\nrefused token %d. Pass $FENCELOCK_TOKEN to your resource the same way.\n", highestSeen.Load(), firstToken.Load())
	return nil
}
