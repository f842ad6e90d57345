package mysql

import (
	"strings"
	"testing"

	"github.com/fencelock/fencelock/driver"
)

// The settings that break the guarantees, each judged and warned about:
// a binary log that is not synced at each commit, asynchronous replicas,
// a replica, and semi-synchronous replication that waits AFTER_SYNC.
func TestSettingsJudged(t *testing.T) {
	durable := settings{server: "MariaDB 10.11", flushLog: 1, replicas: 0, engines: []string{"t=InnoDB", "t_tokens=InnoDB"}, semiSync: "0", waitPoint: "AFTER_COMMIT"}
	for _, c := range []struct {
		name              string
		s                 settings
		durable, failover bool
		warn              string
	}{
		{"durable single server", durable, true, false, ""},
		{"binlog without sync_binlog", with(durable, func(s *settings) { s.logBin, s.syncBinlog = true, 0 }), false, false, "sync_binlog=0"},
		{"binlog with sync_binlog=1", with(durable, func(s *settings) { s.logBin, s.syncBinlog = true, 1 }), true, false, ""},
		{"asynchronous replicas", with(durable, func(s *settings) { s.logBin, s.syncBinlog, s.replicas = true, 1, 2 }), true, false, "2 asynchronous replica(s)"},
		{"semi-synchronous AFTER_SYNC", with(durable, func(s *settings) {
			s.logBin, s.syncBinlog, s.replicas, s.semiSync, s.waitPoint = true, 1, 1, "1", "AFTER_SYNC"
		}), true, true, ""},
		{"a replica", with(durable, func(s *settings) { s.readOnly, s.source = true, "db1" }), false, false, "is a replica"},
		{"MyISAM", with(durable, func(s *settings) { s.engines = []string{"t=MyISAM", "t_tokens=InnoDB"} }), false, false, "not InnoDB"},
	} {
		m := c.s.judge()
		if m[driver.DurableTokens].Met != c.durable || m[driver.Failover].Met != c.failover {
			t.Errorf("%s: durable-tokens %+v, failover %+v; want met %v and %v", c.name, m[driver.DurableTokens], m[driver.Failover], c.durable, c.failover)
		}
		for g, r := range m {
			if !r.Met && r.Fix == "" {
				t.Errorf("%s: %s unmet without a fix", c.name, g)
			}
		}
		w := strings.Join(c.s.warnings(), "\n")
		if (c.warn == "") != (w == "") || !strings.Contains(w, c.warn) {
			t.Errorf("%s: warnings %q; want one naming %q", c.name, w, c.warn)
		}
	}
}

func with(s settings, f func(*settings)) settings {
	s.engines = append([]string(nil), s.engines...)
	f(&s)
	return s
}
