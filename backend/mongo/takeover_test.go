package mongo_test

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// TestTakeoverRace: N contenders, each on its own connection, take over
// the same expired record at once, round after round. At most one wins
// each round, and every winner's token is above every earlier one. (The
// update-based takeover this backend used before failed this on FerretDB:
// FerretDB runs an update as a read followed by an unconditional write,
// so several contenders read the same expired record and all "updated"
// it, with the same token.)
func TestTakeoverRace(t *testing.T) { eachServer(t, testTakeoverRace) }

func testTakeoverRace(t *testing.T, _ server, raw string) {
	const contenders, rounds = 8, 12
	const ttl = 300 * time.Millisecond
	u := withParams(t, raw, "database", testDatabase, "collection", freshCollection(t, raw))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bs := make([]*mongolock.Backend, contenders)
	for i := range bs {
		b, err := mongolock.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs[i] = b
	}
	const key = "hot/expired"
	first, err := bs[0].Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "first", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	last := first.Token
	wins := 0
	for r := range rounds {
		// The holder vanishes: wait (by the server's clock, as the
		// backend sees it) until its record has expired.
		for {
			info, err := bs[0].Inspect(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if !info.Locked() {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(info.Remaining):
			}
		}
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			mu      sync.Mutex
			winners []driver.Grant
		)
		for i, b := range bs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "c" + string(rune('a'+i)), TTL: ttl})
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, g)
					mu.Unlock()
				case errors.Is(err, driver.ErrNotAcquired):
				default:
					// A transient error (a token claim lost to a
					// concurrent winner) is a refusal too.
					t.Logf("round %d contender %d: %v", r, i, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		// Several winners in one round are two holders at once unless
		// each was granted after the previous one's grant expired (a
		// contender delayed by a whole TTL may legitimately take over
		// the first winner's record in turn). A grant's expiry is in its
		// handle; it began TTL before, by the server clock as its
		// Backend estimated it.
		sort.Slice(winners, func(i, j int) bool { return winners[i].Token < winners[j].Token })
		for i := 1; i < len(winners); i++ {
			prev, next := handleExpiry(t, winners[i-1]), handleExpiry(t, winners[i])
			// Two Backends' estimates of the server's clock differ by
			// up to the sum of their bounds.
			var slack time.Duration
			for _, b := range bs {
				slack = max(slack, 2*b.ClockBound()+2*time.Millisecond)
			}
			if next.Add(-ttl).Before(prev.Add(-slack)) {
				t.Fatalf("round %d: %d contenders held the same key at once: %+v (grant %d began %v before grant %d expired)",
					r, len(winners), winners, i, prev.Sub(next.Add(-ttl)), i-1)
			}
		}
		for _, g := range winners {
			wins++
			if g.Token <= last {
				t.Fatalf("round %d: winner's token %d is not above the previous holder's %d", r, g.Token, last)
			}
			last = g.Token
		}
	}
	if wins < rounds/2 {
		t.Fatalf("only %d of %d rounds had a winner: the takeover path is not exercised", wins, rounds)
	}
	t.Logf("%d rounds, %d takeovers, last token %d", rounds, wins, last)
}

// handleExpiry reads a grant's expiry from its handle ("rid/epoch/expiry
// in Unix milliseconds").
func handleExpiry(t *testing.T, g driver.Grant) time.Time {
	t.Helper()
	p := strings.Split(g.Handle, "/")
	ms, err := strconv.ParseInt(p[len(p)-1], 10, 64)
	if err != nil {
		t.Fatalf("handle %q: %v", g.Handle, err)
	}
	return time.UnixMilli(ms)
}

// TestPausedContenderWithdraws: a contender that read a record at epoch 0,
// judged it expired and was paused while the holder renewed twice finds
// the claim of epoch 1 deleted, so its end claim succeeds; it must see the
// holder's later claim and withdraw, leaving the record, the holder's
// renewals and its token alone.
func TestPausedContenderWithdraws(t *testing.T) { eachServer(t, testPausedContenderWithdraws) }

func testPausedContenderWithdraws(t *testing.T, _ server, raw string) {
	ctx := t.Context()
	b, _ := openTest(t, raw)
	const key = "paused/contender"
	req := driver.RenewRequest{TTL: 10 * time.Second}
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: req.TTL})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if g, err = b.Renew(ctx, g, req); err != nil {
			t.Fatal(err)
		}
	}
	err = b.EndAsIfReadAt(ctx, key, 0)
	var he *driver.HeldError
	if !errors.As(err, &he) {
		t.Fatalf("paused contender's end = %v; want a *driver.HeldError (withdrawn: the holder renewed past its epoch)", err)
	}
	info, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Owner != "holder" || info.Token != g.Token {
		t.Fatalf("after the paused contender's end, Inspect = %+v; want the holder with token %d", info, g.Token)
	}
	if g, err = b.Renew(ctx, g, req); err != nil {
		t.Fatalf("holder's renewal after the paused contender withdrew: %v", err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatalf("holder's release: %v", err)
	}
}

// TestStoppedEnderDoesNotStrandKey: an ender that stopped right after its
// end claim (its context ended, its server died) leaves a record that can
// never move again; the next acquire must finish removing it, not report
// the key held until the claim is collected.
func TestStoppedEnderDoesNotStrandKey(t *testing.T) { eachServer(t, testStoppedEnderDoesNotStrandKey) }

func testStoppedEnderDoesNotStrandKey(t *testing.T, _ server, raw string) {
	ctx := t.Context()
	b, _ := openTest(t, raw)
	const key = "stopped/ender"
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ClaimEndOnly(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: 10 * time.Second}); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("holder's renewal after the end claim = %v; want ErrNotHeld", err)
	}
	g2, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "next", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("acquire after a stopped ender: %v; want the key (the ended record removed)", err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("next token %d not above the ended holder's %d", g2.Token, g.Token)
	}
}
