package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.Guarantor = (*Backend)(nil)

// Guarantees implements driver.Guarantor. It reads the server's settings
// (fsync, synchronous_commit, synchronous_standby_names,
// pg_is_in_recovery()) and its standbys (pg_stat_replication), and
// judges:
//
//   - durable-tokens: met with fsync on and synchronous_commit not off
//     (the sequence value and the row are on disk before the commit is
//     acknowledged);
//   - failover: met only when at least one standby streams, every
//     standby is synchronous (sync_state sync or quorum) and
//     synchronous_commit is on or remote_apply, so a promoted standby has
//     every acknowledged grant; an asynchronous or potential standby (or
//     none) leaves it unmet (see judgeReplication);
//   - server-clock: met (now() of each statement).
func (b *Backend) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	var fsync, syncCommit, standbys string
	var recovery bool
	if err := b.pool.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('synchronous_standby_names'), pg_is_in_recovery()").
		Scan(&fsync, &syncCommit, &standbys, &recovery); err != nil {
		return nil, fmt.Errorf("postgres: reading the server's settings: %w", err)
	}
	reps, err := readStandbys(ctx, b.pool)
	if err != nil {
		return nil, err
	}
	return judge(fsync, syncCommit, standbys, recovery, reps), nil
}

// standby is one row of pg_stat_replication. State and SyncState are ""
// when the role cannot see them (neither superuser nor pg_read_all_stats).
type standby struct {
	Name, State, SyncState string
}

// querier is the part of a pool or connection readStandbys needs.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readStandbys reads the standbys streaming from the server.
func readStandbys(ctx context.Context, q querier) ([]standby, error) {
	rows, err := q.Query(ctx, "SELECT coalesce(application_name, ''), coalesce(state, ''), coalesce(sync_state, '') FROM pg_stat_replication ORDER BY 1")
	if err != nil {
		return nil, fmt.Errorf("postgres: reading pg_stat_replication: %w", err)
	}
	reps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (standby, error) {
		var s standby
		err := r.Scan(&s.Name, &s.State, &s.SyncState)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: reading pg_stat_replication: %w", err)
	}
	return reps, nil
}

// judge turns the settings into measurements.
func judge(fsync, syncCommit, standbys string, recovery bool, reps []standby) map[driver.Guarantee]driver.Measurement {
	durable := driver.Measurement{
		Met:      fsync == "on" && syncCommit != "off",
		Observed: fmt.Sprintf("PostgreSQL fsync=%s, synchronous_commit=%s", fsync, syncCommit),
	}
	if !durable.Met {
		durable.Fix = "set fsync = on and synchronous_commit = on in postgresql.conf (ALTER SYSTEM SET ...; SELECT pg_reload_conf(); fsync needs a restart)"
	}
	r := judgeReplication(fsync, syncCommit, standbys, reps)
	failover := driver.Measurement{Met: r.met, Observed: r.observed, Fix: r.fix}
	if recovery {
		failover.Met, durable.Met = false, false
		msg := "; the server is in recovery (a standby): connect to the primary"
		failover.Observed += msg
		durable.Observed += msg
		failover.Fix, durable.Fix = "connect to the primary", "connect to the primary"
	}
	return map[driver.Guarantee]driver.Measurement{
		driver.DurableTokens: durable,
		driver.Failover:      failover,
		driver.ServerClock:   {Met: true, Observed: "expiry judged by the PostgreSQL server's clock (now() of each statement)"},
	}
}

// replication is the verdict on a primary's standbys.
type replication struct {
	met      bool
	observed string
	fix      string
	// warnings are the findings that weaken exclusion or fencing after
	// a failover (Describe's Warnings): asynchronous or potential
	// standbys, and a synchronous standby that commits do not wait for.
	warnings []string
}

// fixFailover is how to meet the failover guarantee.
const fixFailover = "run a synchronous standby: synchronous_standby_names = 'FIRST 1 (standby1)' (or ANY 1 (...)) with synchronous_commit = on or remote_apply, every standby listed there, and fail over only to a synchronous standby"

// judgeReplication judges the failover guarantee from a primary's
// settings and pg_stat_replication. It is met when at least one standby
// streams, every standby is synchronous (sync_state sync, or quorum under
// ANY) and synchronous_commit is on or remote_apply (with fsync on): a
// commit is then acknowledged only after the standby has flushed its WAL,
// and promotion replays every flushed record before the standby accepts
// writes, so a promoted standby has every acknowledged grant and sequence
// value. remote_apply also makes the commit visible on the standby before
// it returns (reads from the standby); for the failover either does.
// remote_write and local are not enough (the standby's copy is not on its
// disk, or not there at all). An async or potential standby (the latter
// streams asynchronously until a synchronous one fails) can lack the
// latest grants when it is promoted: a second holder, and tokens that
// repeat or go backwards.
func judgeReplication(fsync, syncCommit, standbys string, reps []standby) replication {
	var r replication
	var names, async, unknown []string
	sync := 0
	for _, s := range reps {
		names = append(names, fmt.Sprintf("%s (%s, %s)", orUnnamed(s.Name), orUnknown(s.State), orUnknown(s.SyncState)))
		switch s.SyncState {
		case "sync", "quorum":
			sync++
		case "async", "potential":
			async = append(async, orUnnamed(s.Name)+" ("+s.SyncState+")")
		default:
			unknown = append(unknown, orUnnamed(s.Name))
		}
	}
	waits := syncCommit == "on" || syncCommit == "remote_apply"
	obs := fmt.Sprintf("PostgreSQL synchronous_standby_names=%q, synchronous_commit=%s, fsync=%s", standbys, syncCommit, fsync)
	switch {
	case len(reps) == 0 && standbys == "":
		obs += ": no standby streams (a single server: nothing to fail over to that has the grants)"
	case len(reps) == 0:
		obs += ": no standby streams now (commits wait for one, and there is nothing to fail over to)"
	default:
		obs += "; standbys: " + strings.Join(names, ", ")
	}
	if len(async) > 0 {
		r.warnings = append(r.warnings, fmt.Sprintf("asynchronous standby %s: promoted after a failover it can lack the latest acknowledged grants and sequence values (a second holder; tokens that repeat or go backwards); make every standby synchronous (synchronous_standby_names) with synchronous_commit = on or remote_apply, or fail over only to a synchronous one", strings.Join(async, ", ")))
	}
	if sync > 0 && !waits {
		r.warnings = append(r.warnings, fmt.Sprintf("synchronous_commit=%s with a synchronous standby: a commit does not wait until the standby has it on disk, so a failover can lose acknowledged grants; set synchronous_commit = on or remote_apply", syncCommit))
	}
	if len(unknown) > 0 {
		obs += "; the sync state of " + strings.Join(unknown, ", ") + " is hidden from this role"
	}
	r.met = len(reps) > 0 && sync == len(reps) && waits && fsync == "on"
	if r.met {
		obs += ": every standby is synchronous and commits wait for it; promote only one of them (under ANY, the one with the highest pg_last_wal_receive_lsn())"
	}
	r.observed = obs
	if !r.met {
		r.fix = fixFailover
		if len(unknown) > 0 {
			r.fix = "let this role read pg_stat_replication (GRANT pg_monitor TO it), then: " + fixFailover
		}
	}
	return r
}

func orUnnamed(s string) string {
	if s == "" {
		return "(unnamed)"
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
