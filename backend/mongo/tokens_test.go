package mongo_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	mongolock "github.com/fencelock/fencelock/backend/mongo"
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
