package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
)

// startCluster runs a private one-node Redis Cluster owning all 16384
// slots. One node is enough to test what matters to the scripts: in
// cluster mode the server refuses (CROSSSLOT) a script whose keys are not
// in one slot, and go-redis routes and splits pipelines by slot.
func startCluster(t *testing.T) *server {
	t.Helper()
	s := startServer(t, "cluster-enabled yes", "cluster-config-file nodes.conf", "appendonly yes", "appendfsync always")
	rdb := goredis.NewClient(&goredis.Options{Addr: s.addr()})
	defer rdb.Close()
	ctx := t.Context()
	if err := rdb.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("CLUSTER ADDSLOTSRANGE: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(rdb.ClusterInfo(ctx).Val(), "cluster_state:ok") {
		if time.Now().After(deadline) {
			t.Fatal("cluster did not reach state ok")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

// TestClusterHashTags asks a real Cluster node for the slots of the names
// the backend uses: a key's lock, counter and channel share one.
func TestClusterHashTags(t *testing.T) {
	s := startCluster(t)
	ctx := t.Context()
	b, err := fencelockredis.Open(ctx, "redis+cluster://"+s.addr()+"?prefix=ct")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rdb := goredis.NewClient(&goredis.Options{Addr: s.addr()})
	defer rdb.Close()
	slots := map[int64]bool{}
	for _, k := range []string{"{", "}", "}{", "{x}", "a{b}c", "x}:lock", "%7D", "ключ", "plain", "other"} {
		names := []string{"{ct:" + esc(k) + "}:lock", "{ct:" + esc(k) + "}:token", "{ct:" + esc(k) + "}:released"}
		var got []int64
		for _, n := range names {
			got = append(got, rdb.ClusterKeySlot(ctx, n).Val())
		}
		if got[0] != got[1] || got[0] != got[2] {
			t.Errorf("key %q: server slots %v differ", k, got)
		}
		slots[got[0]] = true
		// And the scripts run there (a CROSSSLOT error would fail them).
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: k, Owner: "o", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire(%q) on Cluster: %v", k, err)
		}
		if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute, Rotate: true}); err != nil {
			t.Fatalf("Renew(%q) on Cluster: %v", k, err)
		}
		if n := rdb.Exists(ctx, names[0], names[1]).Val(); n != 2 {
			t.Fatalf("key %q: lock and counter not stored under %q", k, names[:2])
		}
	}
	if len(slots) < 5 {
		t.Errorf("10 keys fell into only %d slots: the hash tag does not spread keys", len(slots))
	}
	infos, err := b.List(ctx, "")
	if err != nil || len(infos) != 10 {
		t.Fatalf("List on Cluster = %d keys, %v; want 10", len(infos), err)
	}
}

func esc(k string) string {
	return strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(k)
}

// TestClusterConformance runs the suite through a ClusterClient.
func TestClusterConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	s := startCluster(t)
	url := "redis+cluster://" + s.addr() + "?prefix=" + uniquePrefix(t)
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) {
			return fencelockredis.Open(ctx, url)
		},
		TTL:    time.Second,
		Leases: 300,
		Restart: func(ctx context.Context) error {
			s.kill() // kill -9; AOF with appendfsync always keeps the counters
			if err := s.startErr(); err != nil {
				return err
			}
			rdb := goredis.NewClient(&goredis.Options{Addr: s.addr()})
			defer rdb.Close()
			for !strings.Contains(rdb.ClusterInfo(ctx).Val(), "cluster_state:ok") {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
			return nil
		},
	})
}
