package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
)

// TestRequireOnSinglePostgresServer checks the verdict on the test
// server, a single PostgreSQL with fsync on and no synchronous standby:
// durable-tokens is met (Open with require=durable-tokens succeeds),
// failover is not (Open refuses it, naming synchronous_standby_names and
// how to set it).
func TestRequireOnSinglePostgresServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := testURL(t)
	url := withParams(t, base, "table", uniqueTable(t, base))
	c, err := fencelock.Open(ctx, withParams(t, url, "require", "durable-tokens,server-clock"), nil)
	if err != nil {
		t.Fatalf("Open with require=durable-tokens on a server with fsync on: %v", err)
	}
	rs, err := driver.CheckGuarantees(ctx, c.Backend(), []fencelock.Guarantee{fencelock.DurableTokens})
	c.Close()
	if err != nil || !rs[0].Met || !strings.Contains(rs[0].Observed, "fsync=on") {
		t.Errorf("durable-tokens = %+v, %v; want met, observed fsync=on", rs, err)
	}
	c, err = fencelock.Open(ctx, withParams(t, url, "require", "failover"), nil)
	if err == nil {
		c.Close()
		t.Fatal("Open with require=failover succeeded on a single server")
	}
	var ue *driver.UnmetGuaranteeError
	if !errors.As(err, &ue) || len(ue.Unmet) != 1 || ue.Unmet[0].Guarantee != fencelock.Failover {
		t.Fatalf("err = %v; want *UnmetGuaranteeError for failover alone", err)
	}
	if r := ue.Unmet[0]; !strings.Contains(r.Observed, `synchronous_standby_names=""`) || !strings.Contains(r.Fix, "synchronous_standby_names") {
		t.Errorf("failover unmet: %+v; want the empty synchronous_standby_names observed and how to set it", r)
	}
}
