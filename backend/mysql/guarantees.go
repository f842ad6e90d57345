package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.Guarantor = (*Backend)(nil)

// settings are the server's settings that decide the guarantees.
type settings struct {
	server     string
	flushLog   int    // innodb_flush_log_at_trx_commit
	logBin     bool   // binary log on
	syncBinlog int    // sync_binlog
	readOnly   bool   // read_only (a replica, usually)
	source     string // this server replicates from (SHOW SLAVE STATUS), "" if not
	replicas   int    // connected replicas (Binlog Dump threads), -1 unknown
	semiSync   string // rpl_semi_sync_master_enabled, "" if unknown
	waitPoint  string // rpl_semi_sync_master_wait_point
	engines    []string
	unknown    []string // what could not be read, and why
}

// readSettings reads the settings. A setting the connection may not read
// (a privilege, a variable the server lacks) is noted in unknown, not an
// error; a failure to reach the server is.
func (b *Backend) readSettings(ctx context.Context) (settings, error) {
	s := settings{server: b.server, replicas: -1}
	var flush int
	var logBin, syncBinlog, readOnly int
	if err := b.db.QueryRowContext(ctx, "SELECT @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog, @@read_only").
		Scan(&flush, &logBin, &syncBinlog, &readOnly); err != nil {
		return s, fmt.Errorf("mysql: reading the server's settings: %w", err)
	}
	s.flushLog, s.logBin, s.syncBinlog, s.readOnly = flush, logBin != 0, syncBinlog, readOnly != 0
	for _, t := range []string{b.n.rawTable, b.n.rawTokens} {
		e, err := b.engineOf(ctx, t)
		if err != nil {
			return s, err
		}
		s.engines = append(s.engines, t+"="+e)
	}
	// The server replicates from a source.
	if rows, err := b.db.QueryContext(ctx, "SHOW SLAVE STATUS"); err != nil {
		s.unknown = append(s.unknown, "SHOW SLAVE STATUS: "+err.Error())
	} else {
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.RawBytes, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if rows.Scan(ptrs...) == nil {
				for i, c := range cols {
					if c == "Master_Host" {
						s.source = string(vals[i])
					}
				}
				if s.source == "" {
					s.source = "a source"
				}
			}
		}
		rows.Close()
	}
	// Replicas connected to this server, as binlog dump threads (seen with
	// the PROCESS privilege).
	var dumps int
	if err := b.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'").Scan(&dumps); err != nil {
		s.unknown = append(s.unknown, "replicas: "+err.Error())
	} else {
		s.replicas = dumps
	}
	var semi, wait sql.NullString
	if err := b.db.QueryRowContext(ctx, "SELECT @@rpl_semi_sync_master_enabled, @@rpl_semi_sync_master_wait_point").Scan(&semi, &wait); err == nil {
		s.semiSync, s.waitPoint = semi.String, wait.String
	}
	return s, nil
}

// durable reports whether a commit is on disk when it is acknowledged.
func (s settings) durable() bool {
	return s.flushLog == 1 && (!s.logBin || s.syncBinlog == 1) && s.innoDB()
}

func (s settings) innoDB() bool {
	for _, e := range s.engines {
		if !strings.HasSuffix(strings.ToLower(e), "=innodb") {
			return false
		}
	}
	return true
}

// warnings are the Describe warnings of these settings.
func (s settings) warnings() []string {
	var w []string
	if s.flushLog != 1 {
		w = append(w, fmt.Sprintf("innodb_flush_log_at_trx_commit=%d: a server crash can lose the last acknowledged grants and counter values; tokens may repeat after a crash (set it to 1)", s.flushLog))
	}
	if s.logBin && s.syncBinlog != 1 {
		w = append(w, fmt.Sprintf("sync_binlog=%d with the binary log on: a crash can lose acknowledged transactions from the binary log, and a replica or a recovery that follows it lacks them (set sync_binlog=1)", s.syncBinlog))
	}
	if !s.innoDB() {
		w = append(w, "tables not InnoDB ("+strings.Join(s.engines, ", ")+"): no transactions or row locks")
	}
	if s.source != "" || s.readOnly {
		w = append(w, "this server is a replica (read_only or replicating from "+s.source+"): connect to the primary")
	}
	if s.replicas > 0 && !(s.semiSync == "1" || strings.EqualFold(s.semiSync, "ON")) {
		w = append(w, fmt.Sprintf("%d asynchronous replica(s): a replica promoted after a failover may lack the latest grants and counter values", s.replicas))
	}
	return w
}

// Guarantees implements driver.Guarantor. It reads the server's settings
// and judges:
//
//   - durable-tokens: met with innodb_flush_log_at_trx_commit=1, with
//     sync_binlog=1 when the binary log is on, and InnoDB tables (the
//     counter and the grant are on disk, together, before the commit is
//     acknowledged), on a server that is not a replica;
//   - failover: met only with semi-synchronous replication waiting
//     AFTER_SYNC on a durable primary (rpl_semi_sync_master_enabled=ON,
//     rpl_semi_sync_master_wait_point=AFTER_SYNC); asynchronous replicas,
//     or none, do not meet it;
//   - server-clock: met (UTC_TIMESTAMP(6) of each statement).
func (b *Backend) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	s, err := b.readSettings(ctx)
	if err != nil {
		return nil, err
	}
	return s.judge(), nil
}

func (s settings) judge() map[driver.Guarantee]driver.Measurement {
	binlog := "off"
	if s.logBin {
		binlog = fmt.Sprintf("on, sync_binlog=%d", s.syncBinlog)
	}
	durable := driver.Measurement{
		Met: s.durable(),
		Observed: fmt.Sprintf("%s innodb_flush_log_at_trx_commit=%d, binary log %s, tables %s",
			s.server, s.flushLog, binlog, strings.Join(s.engines, ", ")),
	}
	if !durable.Met {
		durable.Fix = "set innodb_flush_log_at_trx_commit = 1 (and sync_binlog = 1 if the binary log is on) in the server's configuration (SET GLOBAL works until a restart), and keep the lock tables InnoDB"
	}
	semiOn := s.semiSync == "1" || strings.EqualFold(s.semiSync, "ON")
	failover := driver.Measurement{Met: semiOn && strings.EqualFold(s.waitPoint, "AFTER_SYNC") && s.durable()}
	switch {
	case s.replicas < 0:
		failover.Observed = fmt.Sprintf("%s replicas unknown (%s)", s.server, strings.Join(s.unknown, "; "))
	case s.replicas == 0:
		failover.Observed = fmt.Sprintf("%s with no replica connected: a single server", s.server)
	default:
		failover.Observed = fmt.Sprintf("%s with %d replica(s)", s.server, s.replicas)
	}
	if s.semiSync == "" {
		failover.Observed += ", semi-synchronous replication not available: asynchronous replication can lose the latest grants and counter values"
	} else {
		failover.Observed += fmt.Sprintf(", rpl_semi_sync_master_enabled=%s, rpl_semi_sync_master_wait_point=%s", s.semiSync, s.waitPoint)
		if !semiOn && s.replicas != 0 {
			failover.Observed += ": asynchronous replication can lose the latest grants and counter values"
		}
	}
	if failover.Met {
		failover.Observed += " (semi-synchronous replication falls back to asynchronous after rpl_semi_sync_master_timeout without an acknowledgement: fail over only to a replica that has acknowledged)"
	} else {
		failover.Fix = "replicate semi-synchronously: rpl_semi_sync_master_enabled = ON with rpl_semi_sync_master_wait_point = AFTER_SYNC on a durable primary, and fail over only to a replica that acknowledged every transaction"
	}
	if s.source != "" || s.readOnly {
		failover.Met, durable.Met = false, false
		msg := "; the server is a replica: connect to the primary"
		failover.Observed += msg
		durable.Observed += msg
		failover.Fix, durable.Fix = "connect to the primary", "connect to the primary"
	}
	return map[driver.Guarantee]driver.Measurement{
		driver.DurableTokens: durable,
		driver.Failover:      failover,
		driver.ServerClock:   {Met: true, Observed: "expiry judged by the " + s.server + " server's clock (UTC_TIMESTAMP(6) of each statement)"},
	}
}
