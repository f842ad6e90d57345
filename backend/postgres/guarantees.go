package postgres

import (
	"context"
	"fmt"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.Guarantor = (*Backend)(nil)

// Guarantees implements driver.Guarantor. It reads the server's settings
// (fsync, synchronous_commit, synchronous_standby_names,
// pg_is_in_recovery()) and judges:
//
//   - durable-tokens: met with fsync on and synchronous_commit not off
//     (the sequence value and the row are on disk before the commit is
//     acknowledged);
//   - failover: met only with a synchronous standby named
//     (synchronous_standby_names) and synchronous_commit on or
//     remote_apply, so a promoted standby has every acknowledged grant;
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
	return judge(fsync, syncCommit, standbys, recovery), nil
}

// judge turns the settings into measurements.
func judge(fsync, syncCommit, standbys string, recovery bool) map[driver.Guarantee]driver.Measurement {
	durable := driver.Measurement{
		Met:      fsync == "on" && syncCommit != "off",
		Observed: fmt.Sprintf("PostgreSQL fsync=%s, synchronous_commit=%s", fsync, syncCommit),
	}
	if !durable.Met {
		durable.Fix = "set fsync = on and synchronous_commit = on in postgresql.conf (ALTER SYSTEM SET ...; SELECT pg_reload_conf(); fsync needs a restart)"
	}
	failover := driver.Measurement{
		Met: standbys != "" && (syncCommit == "on" || syncCommit == "remote_apply") && fsync == "on",
		Observed: fmt.Sprintf("PostgreSQL synchronous_standby_names=%q, synchronous_commit=%s, fsync=%s",
			standbys, syncCommit, fsync),
	}
	if standbys == "" {
		failover.Observed += ": no synchronous standby (a single server, or asynchronous streaming replicas that can lack the latest grants and sequence values)"
	}
	if !failover.Met {
		failover.Fix = "run a synchronous standby: synchronous_standby_names = 'FIRST 1 (standby1)' (or ANY 1 (...)) with synchronous_commit = on or remote_apply, and fail over only to a synchronous standby"
	}
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
