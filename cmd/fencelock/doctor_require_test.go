package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/internal/deadstore"
	"github.com/fencelock/fencelock/internal/testenv"
)

// doctorVerdict is the part of doctor --json this test reads.
type doctorVerdict struct {
	Require []struct {
		Guarantee string `json:"guarantee"`
		Met       bool   `json:"met"`
		Observed  string `json:"observed"`
		Fix       string `json:"fix"`
	} `json:"require"`
	RequireMet *bool `json:"require_met"`
}

// TestDoctorRequireJSONExitsNonZeroWhenUnmet checks that doctor --require
// --json prints the verdict on each required guarantee and exits
// exitUnmet on a stock Redis (no AOF), 0 on one with appendfsync always;
// and that --require on other commands refuses to run on the stock one,
// with the same exit status.
func TestDoctorRequireJSONExitsNonZeroWhenUnmet(t *testing.T) {
	f := newFixture(t)
	stock := os.Getenv("FENCELOCK_TEST_REDIS_STOCK")
	if stock == "" {
		_, stock = deadstore.OwnServer(t, "redis-stock", "stock Redis")
	}
	stdout, stderr, code := f.run("doctor", "--json", "--require", "durable-tokens,server-clock", "--url", stock)
	var v doctorVerdict
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("doctor --json output is not JSON (%v):\n%s%s", err, stdout, stderr)
	}
	if code != exitUnmet || v.RequireMet == nil || *v.RequireMet || len(v.Require) != 2 {
		t.Fatalf("doctor --require on a stock Redis: exit %d (want %d), verdict %+v\n%s", code, exitUnmet, v, stderr)
	}
	if r := v.Require[0]; r.Guarantee != "durable-tokens" || r.Met || !strings.Contains(r.Observed, "appendonly=no") || !strings.Contains(r.Fix, "appendfsync always") {
		t.Errorf("durable-tokens verdict %+v; want not met, appendonly=no observed, appendfsync always as the fix", r)
	}
	if r := v.Require[1]; r.Guarantee != "server-clock" || !r.Met {
		t.Errorf("server-clock verdict %+v; want met", r)
	}
	_, stderr, code = f.run("status", "--require", "durable-tokens", "--url", stock, "k")
	if code != exitUnmet || !strings.Contains(stderr, "durable-tokens") {
		t.Errorf("status --require durable-tokens on a stock Redis: exit %d, want %d:\n%s", code, exitUnmet, stderr)
	}

	good := testenv.URL(t, "FENCELOCK_TEST_REDIS")
	stdout, stderr, code = f.run("doctor", "--json", "--url", good+"?require=durable-tokens")
	v = doctorVerdict{}
	if err := json.Unmarshal([]byte(stdout), &v); err != nil || v.RequireMet == nil || !*v.RequireMet || code == exitUnmet {
		t.Errorf("doctor with require=durable-tokens on a Redis with appendfsync always: exit %d, %v:\n%s%s", code, err, stdout, stderr)
	}
	_, stderr, code = f.run("doctor", "--require", "durabel-tokens", "--url", good)
	if code != exitUsage || !strings.Contains(stderr, "did you mean durable-tokens?") {
		t.Errorf("doctor --require durabel-tokens: exit %d, want %d with a did-you-mean:\n%s", code, exitUsage, stderr)
	}
}
