package postgres

import (
	"strings"
	"testing"
)

// TestJudgeReplicationNeedsEveryStandbySynchronous checks the failover
// verdict from pg_stat_replication's rows: met only when standbys stream,
// all of them sync or quorum, and commits wait for them (on or
// remote_apply); an async or potential standby is a warning as well.
func TestJudgeReplicationNeedsEveryStandbySynchronous(t *testing.T) {
	sync := standby{"member2", "streaming", "sync"}
	for _, tc := range []struct {
		name                 string
		syncCommit, standbys string
		reps                 []standby
		met                  bool
		warn                 string // substring of a warning, "" for none
		observed             string
	}{
		{"single server", "on", "", nil, false, "", "no standby streams"},
		{"async standby", "on", "", []standby{{"member2", "streaming", "async"}}, false, "asynchronous standby member2 (async)", "member2 (streaming, async)"},
		{"sync remote_apply", "remote_apply", "FIRST 1 (member2)", []standby{sync}, true, "", "every standby is synchronous"},
		{"sync on", "on", "FIRST 1 (member2)", []standby{sync}, true, "", "every standby is synchronous"},
		{"quorum", "on", "ANY 1 (a, b)", []standby{{"a", "streaming", "quorum"}, {"b", "streaming", "quorum"}}, true, "", "highest pg_last_wal_receive_lsn"},
		{"sync and potential", "on", "FIRST 1 (member2, member3)", []standby{sync, {"member3", "streaming", "potential"}}, false, "member3 (potential)", "member3 (streaming, potential)"},
		{"sync but remote_write", "remote_write", "FIRST 1 (member2)", []standby{sync}, false, "synchronous_commit=remote_write", ""},
		{"sync but local", "local", "FIRST 1 (member2)", []standby{sync}, false, "synchronous_commit=local", ""},
		{"named but none streams", "on", "FIRST 1 (member2)", nil, false, "", "no standby streams now"},
		{"hidden sync state", "on", "", []standby{{"", "", ""}}, false, "", "hidden from this role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := judgeReplication("on", tc.syncCommit, tc.standbys, tc.reps)
			if r.met != tc.met {
				t.Errorf("met = %v, want %v (observed %q)", r.met, tc.met, r.observed)
			}
			if !strings.Contains(r.observed, tc.observed) {
				t.Errorf("observed %q, want it to say %q", r.observed, tc.observed)
			}
			warned := strings.Join(r.warnings, "\n")
			if tc.warn == "" && warned != "" || !strings.Contains(warned, tc.warn) {
				t.Errorf("warnings %q, want %q", r.warnings, tc.warn)
			}
			if !r.met && !strings.Contains(r.fix, "synchronous_standby_names") {
				t.Errorf("fix %q does not say how to meet it", r.fix)
			}
			if r.met && r.fix != "" {
				t.Errorf("met, yet fix %q", r.fix)
			}
		})
	}
	if r := judgeReplication("off", "on", "FIRST 1 (member2)", []standby{sync}); r.met {
		t.Errorf("fsync=off judged failover-safe: %q", r.observed)
	}
}
