package main

import (
	"reflect"
	"testing"
	"time"

	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/report"
)

func shard(rounds int, ok bool, count int) report.Cell {
	return report.Cell{
		Backend: "zookeeper3", Fault: "follower-partitioned",
		Rounds: rounds, Duration: time.Duration(rounds) * time.Second,
		Result: check.Result{
			Properties: []check.Property{
				{ID: "P1", OK: true, Checked: 10 * rounds},
				{ID: "P2", OK: ok, Checked: rounds, Count: count},
			},
			Stats: check.Stats{
				Writes: 100 * rounds, WritesAccepted: 100 * rounds, Faults: rounds,
				MaxToken:        uint64(rounds),
				DetectionMargin: check.Dist{N: rounds, Min: time.Duration(rounds), P50: time.Second, P99: 2 * time.Second, Max: 3 * time.Second},
			},
		},
		Verdict: report.Safe,
	}
}

func TestShardsOfOneCellBecomeOneCellWithTheirRoundsSummed(t *testing.T) {
	other := report.Cell{Backend: "zookeeper3", Fault: "leader-kill", Rounds: 7, Verdict: report.Safe}
	got := mergeCells([]report.Cell{shard(200, true, 0), other, shard(300, true, 0)})
	if len(got) != 2 || got[0].Fault != "follower-partitioned" || got[1].Fault != "leader-kill" {
		t.Fatalf("cells = %+v, want follower-partitioned then leader-kill", got)
	}
	c := got[0]
	if c.Rounds != 500 || c.Duration != 500*time.Second {
		t.Errorf("rounds %d, duration %v; want 500 and 500s", c.Rounds, c.Duration)
	}
	if s := c.Result.Stats; s.Writes != 50000 || s.Faults != 500 || s.MaxToken != 300 {
		t.Errorf("stats writes %d faults %d max token %d; want 50000, 500, 300", s.Writes, s.Faults, s.MaxToken)
	}
	if p, _ := c.Result.Property("P1"); p.Checked != 5000 || !p.OK {
		t.Errorf("P1 = %+v, want checked 5000 and ok", p)
	}
	d := c.Result.Stats.DetectionMargin
	if d.N != 500 || d.Min != 200 || d.Max != 3*time.Second {
		t.Errorf("detection margin %+v: want N 500, exact min 200ns and max 3s", d)
	}
	if c.Verdict != report.Safe {
		t.Errorf("verdict %s, want safe", c.Verdict)
	}
}

func TestAViolationInOneShardMakesTheMergedCellUnsafe(t *testing.T) {
	got := mergeCells([]report.Cell{shard(200, true, 0), shard(200, false, 2)})
	c := got[0]
	p, _ := c.Result.Property("P2")
	if p.OK || p.Count != 2 {
		t.Errorf("P2 = %+v, want not ok with 2 violations", p)
	}
	if c.Verdict != report.UnsafeUnexpected {
		t.Errorf("verdict %s, want %s: one shard's violation is the cell's", c.Verdict, report.UnsafeUnexpected)
	}
}

// TestEveryStatIsMerged fails when check.Stats gains a field that
// mergeStats leaves at the first shard's value.
func TestEveryStatIsMerged(t *testing.T) {
	var a, b check.Stats
	set(reflect.ValueOf(&b).Elem(), 7)
	m := reflect.ValueOf(mergeStats(a, b))
	for i := range m.NumField() {
		if m.Field(i).IsZero() {
			t.Errorf("Stats.%s: merging a zero shard with a shard of 7s gave zero", m.Type().Field(i).Name)
		}
	}
}

// set sets every number in v, a struct, to n.
func set(v reflect.Value, n int64) {
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(n)
		case reflect.Uint64:
			f.SetUint(uint64(n))
		case reflect.Struct:
			set(f, n)
		}
	}
}

func TestCellsAShardRanAreNotListedAsNotRun(t *testing.T) {
	ran := []report.Cell{{Backend: "redisha-acked", Fault: "primary-kill-failover"}}
	notRun := []report.NotRun{
		{Backend: "redisha-acked", Fault: "primary-kill-failover", Why: "other shard"},
		{Backend: "redisha-acked", Fault: "server-kill", Why: "no control"},
		{Backend: "redisha-acked", Fault: "server-kill", Why: "no control"},
	}
	got := stillNotRun(notRun, ran)
	if len(got) != 1 || got[0].Fault != "server-kill" {
		t.Errorf("not run = %+v, want server-kill once", got)
	}
}

func TestMergedProfileNamesItsShards(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{[]string{"soak (91 rounds)"}, "soak (91 rounds)"},
		{[]string{"soak (200 rounds)", "soak (200 rounds)"}, "soak (200 rounds), 2 shards"},
		{[]string{"soak (500 rounds)", "soak (250 rounds)", "soak (250 rounds)"}, "3 shards: 1 × soak (500 rounds) + 2 × soak (250 rounds)"},
	} {
		if got := shardProfile(c.in); got != c.want {
			t.Errorf("shardProfile(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
