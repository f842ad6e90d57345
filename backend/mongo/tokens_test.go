package mongo_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	mongolock "github.com/fencelock/fencelock/backend/mongo"
	"github.com/fencelock/fencelock/driver"
)

// TestTokensFollowHolders: under contention, each holder's token is above
// the previous holder's. (Taking the token before the lock, as a first
// design did, fails this: a contender's early token is overtaken by a
// later holder's and then handed out after it.)
func TestTokensFollowHolders(t *testing.T) { eachServer(t, testTokensFollowHolders) }

func testTokensFollowHolders(t *testing.T, _ server, raw string) {
	u := withParams(t, raw, "database", testDatabase, "collection", freshCollection(t, raw))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	var last fencelock.Token
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		b, err := mongolock.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := fencelock.New(b, &fencelock.Options{TTL: 2 * time.Second, MinBackoff: 2 * time.Millisecond, MaxBackoff: 250 * time.Millisecond})
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < 10; r++ {
				l, err := c.Acquire(ctx, "k")
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				mu.Lock()
				if l.Token() <= last {
					t.Errorf("holder got token %d after a holder with token %d", l.Token(), last)
				}
				last = l.Token()
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					t.Errorf("release: %v", err)
				}
			}
		}()
	}
	wg.Wait()
}

// TestRetryOfRecordWithoutClaim: an acquire whose token claim failed after
// its record was inserted (and whose removal of the record failed too)
// leaves a live record of its owner with an unclaimed token. The owner's
// retry may be granted that record only once the token is claimed for it:
// otherwise the next holder, reading the key's highest claim, would get the
// same token. If the token's claim names another record, the retry is
// refused.
func TestRetryOfRecordWithoutClaim(t *testing.T) { eachServer(t, testRetryOfRecordWithoutClaim) }

func testRetryOfRecordWithoutClaim(t *testing.T, _ server, raw string) {
	ctx := t.Context()
	a, u := openTest(t, raw)
	const ttl = 10 * time.Second
	for _, key := range []string{"retry/unclaimed", "retry/claimed-by-other"} {
		g, err := a.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "first", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		tok, err := a.InsertRecordOnly(ctx, key, "retrier", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if key == "retry/claimed-by-other" {
			if err := a.ClaimTokenForOther(ctx, key, tok); err != nil {
				t.Fatal(err)
			}
			_, err := a.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "retrier", TTL: ttl})
			var he *driver.HeldError
			if !errors.As(err, &he) {
				t.Fatalf("%s: retry over a record whose token is claimed by another = %v; want a *driver.HeldError", key, err)
			}
			continue
		}
		g, err = a.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "retrier", TTL: ttl})
		if err != nil {
			t.Fatalf("%s: retry: %v", key, err)
		}
		if int64(g.Token) != tok {
			t.Fatalf("%s: retry got token %d; want the record's %d", key, g.Token, tok)
		}
		if err := a.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		b, err := mongolock.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		g2, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "next", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if g2.Token <= g.Token {
			t.Fatalf("%s: next holder's token %d is not above the retried grant's %d", key, g2.Token, g.Token)
		}
	}
}
