package redis_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/deadstore"
	"github.com/fencelock/fencelock/internal/testenv"
)

// stockRedis returns the URL of a Redis in its packaged configuration
// (RDB snapshots, no AOF): FENCELOCK_TEST_REDIS_STOCK if set, else one of
// the test's own started by testenv.
func stockRedis(t *testing.T) string {
	if u := os.Getenv("FENCELOCK_TEST_REDIS_STOCK"); u != "" {
		return u
	}
	_, u := deadstore.OwnServer(t, "redis-stock", "stock Redis")
	return u
}

// TestRequireDurableTokensRefusedOnStockRedis checks that
// require=durable-tokens refuses a Redis without AOF at Open, with an
// *UnmetGuaranteeError that says what the server has (appendonly=no) and
// what to set.
func TestRequireDurableTokensRefusedOnStockRedis(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := withPrefix(stockRedis(t), uniquePrefix(t)) + "&require=durable-tokens,server-clock"
	c, err := fencelock.Open(ctx, url, nil)
	if err == nil {
		c.Close()
		t.Fatal("Open with require=durable-tokens succeeded on a Redis without AOF")
	}
	var ue *driver.UnmetGuaranteeError
	if !errors.As(err, &ue) || !errors.Is(err, fencelock.ErrGuaranteeUnmet) {
		t.Fatalf("err = %v; want *UnmetGuaranteeError matching ErrGuaranteeUnmet", err)
	}
	if len(ue.Unmet) != 1 || ue.Unmet[0].Guarantee != fencelock.DurableTokens {
		t.Fatalf("unmet = %+v; want durable-tokens alone (server-clock is met)", ue.Unmet)
	}
	r := ue.Unmet[0]
	if !strings.Contains(r.Observed, "appendonly=no") {
		t.Errorf("observed %q; want it to name appendonly=no", r.Observed)
	}
	if !strings.Contains(r.Fix, "appendonly yes and appendfsync always") {
		t.Errorf("fix %q; want appendonly yes and appendfsync always", r.Fix)
	}
	t.Logf("refused: %v", err)
}

// TestRequireDurableTokensAcceptedWithAppendfsyncAlways checks that the
// same requirement opens on a Redis with appendonly yes and appendfsync
// always (the project's test Redis), and that failover, which no Redis
// meets, is refused there with a way out.
func TestRequireDurableTokensAcceptedWithAppendfsyncAlways(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := withPrefix(testenv.URL(t, "FENCELOCK_TEST_REDIS"), uniquePrefix(t))
	c, err := fencelock.Open(ctx, base+"&require=durable-tokens", nil)
	if err != nil {
		t.Fatalf("Open with require=durable-tokens on a Redis with appendfsync always: %v", err)
	}
	rs, err := driver.CheckGuarantees(ctx, c.Backend(), []fencelock.Guarantee{fencelock.DurableTokens})
	c.Close()
	if err != nil || len(rs) != 1 || !rs[0].Met || !strings.Contains(rs[0].Observed, "appendfsync=always") {
		t.Errorf("CheckGuarantees durable-tokens = %+v, %v; want met, observed appendfsync=always", rs, err)
	}
	_, err = fencelock.Open(ctx, base, &fencelock.Options{Require: []fencelock.Guarantee{fencelock.Failover}})
	var ue *driver.UnmetGuaranteeError
	if !errors.As(err, &ue) || len(ue.Unmet) != 1 || !strings.Contains(ue.Unmet[0].Fix, "etcd or ZooKeeper") {
		t.Errorf("Options.Require failover on Redis: %v; want unmet, pointing at etcd or ZooKeeper", err)
	}
}
