package mongo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/faultproxy"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// reopen starts a proxy on the address of p, which was closed (a server
// that comes back on its port).
func reopen(t *testing.T, p *faultproxy.Proxy) *faultproxy.Proxy {
	t.Helper()
	q, err := faultproxy.ListenAt(p.Addr(), p.Target())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// TestUnreachableEndsWhenServerIsBack: after calls failed with
// ErrUnreachable on a server that vanished, a server back on its port
// serves the next calls within 20s, with the default heartbeat and with
// heartbeatFrequencyMS=60000: the error does not stick.
func TestUnreachableEndsWhenServerIsBack(t *testing.T) {
	eachServer(t, testUnreachableEndsWhenServerIsBack)
}

func testUnreachableEndsWhenServerIsBack(t *testing.T, _ server, raw string) {
	const ttl = 3 * time.Second
	for _, hb := range []string{"", "60000"} {
		p := newProxy(t, raw)
		params := []string{"database", testDatabase, "collection", freshCollection(t, raw)}
		if hb != "" {
			params = append(params, "heartbeatFrequencyMS", hb)
		}
		c, err := fencelock.Open(context.Background(), withParams(t, viaProxy(t, p, raw), params...), &fencelock.Options{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		p.Close()
		for i := range 3 {
			_, err = c.TryAcquire(context.Background(), "back/k")
			if !errors.Is(err, mongolock.ErrUnreachable) {
				t.Logf("call %d on the vanished server: %v", i, err)
			}
		}
		reopen(t, p)
		back := time.Now()
		deadline := back.Add(20 * time.Second)
		var n int
		for {
			n++
			l, err := c.TryAcquire(context.Background(), "back/k")
			if err == nil {
				t.Logf("hb=%q: served %v after the server came back, call %d", hb, time.Since(back).Round(time.Millisecond), n)
				_ = l.Release(context.Background())
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("hb=%q: still failing 20s after the server came back (%d calls): %v", hb, n, err)
			}
			time.Sleep(100 * time.Millisecond) // polling a recovery: no event to await
		}
	}
}
