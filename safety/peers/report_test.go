package peers

import (
	"strings"
	"testing"

	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/report"
)

// TestMarkdownFailoverColumn checks that the failover column shows each
// library's cell of its store's cluster fault, fencelock's cell of that
// cluster and fault, and "not measured" where the main report has none
// (never another cell's verdict).
func TestMarkdownFailoverColumn(t *testing.T) {
	p2 := check.Result{Properties: []check.Property{{ID: "P1", OK: true}, {ID: "P2", OK: false}}}
	r := Report{
		Libs:      []Lib{{Name: Redsync, Store: "redis"}, {Name: EtcdMutex, Store: "etcd", Tokens: true}},
		Faults:    []string{"baseline", FailoverFault},
		Failovers: Failovers,
		Cells: []report.Cell{
			{Backend: Redsync, Fault: "primary-kill-failover", Verdict: report.Safe},
			{Backend: EtcdMutex, Fault: "leader-kill", Result: p2, Verdict: report.UnsafeExpected},
		},
		Fencelock: []report.Cell{
			{Backend: "redis", Fault: "baseline", Verdict: report.Safe},
			{Backend: "redis", Fault: "failover", Verdict: "wrong-cell"}, // not redisha's
			{Backend: "redisha", Fault: "primary-kill-failover", Verdict: report.SafeWithFencing},
		},
	}
	var b strings.Builder
	if err := r.Markdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"| redsync | redis | no | not run | safe |",
		"| etcd-mutex | etcd | yes | not run | tokens repeated or went back |",
		"| *fencelock* | redis | yes | safe | " + string(report.SafeWithFencing) + " |",
		"| *fencelock* | etcd | yes | not measured | not measured |",
		"redis on redisha (primary-kill-failover)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "wrong-cell") {
		t.Errorf("the failover column shows fencelock's single-server cell, not its cluster's:\n%s", md)
	}
}
