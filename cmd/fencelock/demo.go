package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

const demoUsage = `
Usage: fencelock demo [--url URL]

A demonstration of fencing: three workers compete for one lock that
protects a resource which checks fencing tokens. The first holder is
paused past its TTL (as a long GC pause or a SIGSTOP would: its renewals
stop reaching the store), a new holder takes over with a higher token, and
the resource refuses the paused holder's late write.

Without --url it runs in this process on the memory backend (no store, no
files) and takes about two seconds. With --url it runs on your store, on a
key of its own under fencelock-demo/ that it releases at the end, with the
URL's ttl or 3s (so it takes about ten seconds).
`

// demoTTL is the demo's lease TTL: short, so the demo is quick, and long
// enough for a busy machine.
const demoTTL = 600 * time.Millisecond

// demoURLTTL is the demo's lease TTL on a store given by --url when the
// URL sets none: every backend keeps a lease this short.
const demoURLTTL = 3 * time.Second

func cmdDemo(e *env, args []string) int {
	fset := e.flagSet("demo", demoUsage, "Examples:\n  fencelock demo\n  fencelock demo --url redis://localhost:6379")
	var cf connFlags
	addConnFlags(fset, &cf)
	pos, rest, exit, stop := e.parse(fset, args, 0)
	if stop {
		return exit
	}
	if len(pos) != 0 || len(rest) != 0 {
		return e.usageError("demo", "takes no arguments")
	}
	st := memoryDemo()
	if cf.url != "" {
		var err error
		if st, err = e.urlDemo(&cf); err != nil {
			return e.fail("demo", err, nil)
		}
	}
	defer st.close()
	if err := runDemo(e.stdout, st); err != nil {
		fmt.Fprintf(e.stderr, "fencelock demo: %v\n", driver.RedactText(err.Error(), cf.url))
		return exitSoftware
	}
	return exitOK
}

// demoStore is where the demo's workers lock: the memory backend, or the
// user's store.
type demoStore struct {
	where string
	key   string
	ttl   time.Duration
	// client returns worker name's client and the switch that cuts it
	// off from the store (its renewals fail) or reconnects it.
	client func(name string) (*fencelock.Client, func(cut bool), error)
	close  func()
}

func memoryDemo() *demoStore {
	store := memory.NewStore()
	return &demoStore{
		where: "the memory backend", key: "reports/daily", ttl: demoTTL, close: func() {},
		client: func(name string) (*fencelock.Client, func(bool), error) {
			b := store.Backend()
			c, err := fencelock.New(b, &fencelock.Options{TTL: demoTTL, Owner: name, MaxBackoff: demoTTL / 4})
			return c, b.SetUnreachable, err
		},
	}
}

// urlDemo opens one backend per worker on the store at --url. A worker is
// paused by failing its renewals (pausable), as a frozen process's never
// reach the store.
func (e *env) urlDemo(cf *connFlags) (*demoStore, error) {
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	st := &demoStore{where: "your store", key: "fencelock-demo/reports-" + hex.EncodeToString(suffix[:]), ttl: demoURLTTL}
	var opened []*fencelock.Client
	st.close = func() {
		for _, c := range opened {
			c.Close()
		}
	}
	// Check the URL and that the store answers, as every command does.
	c, err := e.open(context.Background(), cf, nil, st.key)
	if err != nil {
		return nil, err
	}
	c.Close()
	st.client = func(name string) (*fencelock.Client, func(bool), error) {
		ctx, cancel := context.WithTimeout(context.Background(), cf.connectTimeout)
		defer cancel()
		b, o, err := fencelock.OpenBackend(ctx, cf.url)
		if err != nil {
			return nil, nil, err
		}
		if o.TTL == 0 {
			o.TTL = demoURLTTL
		}
		st.ttl = o.TTL
		o.Owner, o.MaxBackoff = name, o.TTL/4
		p := &pausable{Backend: b}
		c, err := fencelock.New(p, o)
		if err != nil {
			b.Close()
			return nil, nil, err
		}
		opened = append(opened, c)
		return c, p.paused.Store, nil
	}
	return st, nil
}

// pausable is a backend whose renewals fail while paused: the store stops
// hearing from its holder, as it does from a frozen process.
type pausable struct {
	driver.Backend
	paused atomic.Bool
}

var errPaused = errors.New("fencelock demo: this worker is paused")

func (p *pausable) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if p.paused.Load() {
		return driver.Grant{}, errPaused
	}
	return p.Backend.Renew(ctx, g, req)
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

func runDemo(w io.Writer, st *demoStore) error {
	key := st.key
	var fence fencelock.Fence // the resource's side: remembers the highest token
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+10*st.ttl)
	defer cancel()

	type worker struct {
		c   *fencelock.Client
		cut func(bool)
	}
	var workers []worker
	for i := 1; i <= 3; i++ {
		c, cut, err := st.client("worker-" + strconv.Itoa(i))
		if err != nil {
			return err
		}
		defer c.Close()
		workers = append(workers, worker{c, cut})
	}
	ttl := st.ttl
	fmt.Fprintf(w, "Three workers compete for the lock %q (TTL %v) on %s.\n", key, ttl, st.where)
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

	for i, wk := range workers {
		name := "worker-" + strconv.Itoa(i+1)
		c := wk.c
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
				wk.cut(true)
				select {
				case <-takeover:
				case <-ctx.Done():
					return
				}
				time.Sleep(ttl / 6) // the pause lasts a little longer
				wk.cut(false)
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
