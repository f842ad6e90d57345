package nats

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
)

// The tests on scripts/testenv's nats3: three servers in a JetStream
// cluster, the URL naming all three with replicas=3
// (FENCELOCK_TEST_NATS3). Each uses a bucket of its own.

// TestConformanceR3Cluster runs the suite against a bucket with three
// replicas on a cluster of three, when FENCELOCK_NATS3_CONFORMANCE=1 (it
// takes about two minutes; CI runs the cluster's own tests below). Its
// store restart kills every member with SIGKILL and starts them again
// with their data: tokens go on from the replicated stream's sequence.
// After such a restart NATS elects its meta leader and the stream's
// leader again, which took 10 s to more than 30 s on the loopback
// cluster, so Open waits up to 30 s and that case can still fail.
func TestConformanceR3Cluster(t *testing.T) {
	u := testURL(t, "FENCELOCK_TEST_NATS3") + "&connect_timeout=30s"
	if os.Getenv("FENCELOCK_NATS3_CONFORMANCE") != "1" {
		t.Skip("FENCELOCK_NATS3_CONFORMANCE=1 runs the conformance suite on the R3 cluster (about two minutes)")
	}
	conformance.Run(t, harness(u, testenv.Restart("nats3")))
}

// openCluster opens n backends (separate connections) on nats3, on one
// fresh bucket of the given replicas.
func openCluster(t *testing.T, replicas string, n int) []*Backend {
	t.Helper()
	u, err := url.Parse(testURL(t, "FENCELOCK_TEST_NATS3"))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("replicas", replicas)
	u.RawQuery = q.Encode()
	var bs []*Backend
	for range n {
		bs = append(bs, openURL(t, u.String()))
	}
	return bs
}

func openURL(t *testing.T, u string) *Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := Open(ctx, u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = b.js.DeleteKeyValue(ctx, b.bucket)
		b.Close()
	})
	return b
}

func guaranteesOf(t *testing.T, b *Backend) map[driver.Guarantee]driver.Measurement {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := b.Guarantees(ctx)
	if err != nil {
		t.Fatalf("Guarantees: %v", err)
	}
	return g
}

// TestR3BucketMeetsFailover: a file-backed bucket with three replicas on
// a cluster of three is FailoverSafe without a replicas warning, and its
// stream, as the server reports it, meets durable-tokens and failover; a
// bucket with one replica on the same cluster meets neither and says to
// use replicas=3.
func TestR3BucketMeetsFailover(t *testing.T) {
	t.Run("R3", func(t *testing.T) {
		b := openCluster(t, "3", 1)[0]
		d := b.Describe()
		if !d.FailoverSafe || len(d.Warnings) != 0 || !strings.Contains(d.Failover, "3 replicas") {
			t.Errorf("Describe: FailoverSafe %v, Failover %q, warnings %q; want safe with 3 replicas, no warning", d.FailoverSafe, d.Failover, d.Warnings)
		}
		g := guaranteesOf(t, b)
		for _, k := range []driver.Guarantee{driver.Failover, driver.DurableTokens} {
			if m := g[k]; !m.Met || !strings.Contains(m.Observed, "3 replica(s)") {
				t.Errorf("%s = %+v; want met, 3 replicas observed", k, m)
			}
		}
	})
	t.Run("R1", func(t *testing.T) {
		b := openCluster(t, "1", 1)[0]
		d := b.Describe()
		if d.FailoverSafe || !strings.Contains(strings.Join(d.Warnings, "\n"), "replicas=3") {
			t.Errorf("Describe: FailoverSafe %v, warnings %q; want unsafe, a warning naming replicas=3", d.FailoverSafe, d.Warnings)
		}
		g := guaranteesOf(t, b)
		for _, k := range []driver.Guarantee{driver.Failover, driver.DurableTokens} {
			if m := g[k]; m.Met || !strings.Contains(m.Fix, "replicas=3") {
				t.Errorf("%s = %+v; want unmet, a fix naming replicas=3", k, m)
			}
		}
	})
}

// TestScansSeeEveryAcknowledgedWrite: on an R3 bucket, List and HighWater
// right after a grant report it, and HighWater's Global covers a floor
// raised just before. They read the bucket through a consumer, which
// must be served by the stream's leader: placed on a follower, it reads
// that replica's copy of the stream, which can lag behind writes already
// acknowledged (List then misses a held key, HighWater a token issued).
func TestScansSeeEveryAcknowledgedWrite(t *testing.T) {
	b := openCluster(t, "3", 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range 30 {
		key := fmt.Sprintf("scan/%02d", i)
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "o" + key, TTL: 30 * time.Second})
		if err != nil {
			t.Fatalf("Acquire(%s): %v", key, err)
		}
		ls, err := b.List(ctx, key)
		if err != nil {
			t.Fatalf("List(%s): %v", key, err)
		}
		if len(ls) != 1 || ls[0].Token != g.Token {
			t.Errorf("round %d: List(%s) right after its grant (token %d) = %+v; want that grant", i, key, g.Token, ls)
		}
		floor := g.Token + 1000
		if err := b.RaiseFloor(ctx, key+"/f", floor); err != nil {
			t.Fatalf("RaiseFloor: %v", err)
		}
		hw, err := b.HighWater(ctx, key)
		if err != nil {
			t.Fatalf("HighWater(%s): %v", key, err)
		}
		if hw.Keys[key] != g.Token || hw.Global < floor {
			t.Errorf("round %d: HighWater(%s) = %+v; want key token %d and Global at least the floor %d raised before it", i, key, hw, g.Token, floor)
		}
	}
}

// TestFloorRaisedDuringReleaseHoldsOnR3: a floor raised while the
// holder releases is above the holder's next grant. On a cluster the
// stream's leader checks a write's expected sequence before the writes
// in flight ahead of it are stored, and it holds back a second write only
// if it names the same subject (or filter) to compare: a floor record
// compared on its own subject and a release compared on the key's
// wildcard passed together, the release's marker landed after the raise,
// and the releasing backend's next Acquire, expecting that marker, was
// stored with the offset from before the raise: a token below a floor
// raised before the Acquire began.
func TestFloorRaisedDuringReleaseHoldsOnR3(t *testing.T) {
	bs := openCluster(t, "3", 2)
	holder, raiser := bs[0], bs[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key = "floor-during-release"
	for i := range 150 {
		g, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: 30 * time.Second})
		if err != nil {
			t.Fatalf("round %d: Acquire: %v", i, err)
		}
		floor := g.Token + 1000
		var wg sync.WaitGroup
		var relErr, raiseErr error
		// The release starts later in each round (a sweep of 0-3 ms),
		// so that in some rounds it is in flight with the raise's write,
		// which follows two reads.
		lag := time.Duration(i%30) * 100 * time.Microsecond
		wg.Go(func() { raiseErr = raiser.RaiseFloor(ctx, key, floor) })
		wg.Go(func() {
			time.Sleep(lag)
			relErr = holder.Release(ctx, g)
		})
		wg.Wait()
		if relErr != nil || raiseErr != nil {
			t.Fatalf("round %d: Release: %v; RaiseFloor: %v", i, relErr, raiseErr)
		}
		g2, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: 30 * time.Second})
		if err != nil {
			t.Fatalf("round %d: Acquire after the raise: %v", i, err)
		}
		if g2.Token <= floor {
			t.Fatalf("round %d: token %d after RaiseFloor(%d) returned; want above the floor", i, g2.Token, floor)
		}
		if err := holder.Release(ctx, g2); err != nil {
			t.Fatalf("round %d: Release: %v", i, err)
		}
	}
}
