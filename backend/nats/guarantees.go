package nats

import (
	"context"
	"fmt"

	"github.com/fencelock/fencelock/driver"
)

// Describe implements driver.Describer, from the bucket's configuration
// as New found it.
func (b *Backend) Describe() driver.Description {
	c := b.cfg
	d := driver.Description{
		Name:          "nats",
		Fencing:       "the JetStream stream sequence of the write that acquired (or rotated) the lock, plus the key's floor offset; strictly increasing per key, surviving restarts with file storage",
		Clock:         "server (per-message TTLs, NATS Server 2.11+)",
		Liveness:      "TTL",
		Scope:         driver.ScopeKey,
		FailoverSafe:  c.Storage == "file" && c.Replicas >= 3,
		LossDetection: "pushed by a watch on the bucket (the marker the server writes where it removes an expired record, a force release), else " + driver.LossByRenewal,
	}
	switch {
	case c.Storage != "file":
		d.Failover = "memory storage: a restart of the servers loses every lock and resets the token sequence"
		d.Warnings = append(d.Warnings, fmt.Sprintf("bucket %q is memory-backed: a server restart loses locks and tokens go back to 1; create it with file storage", b.bucket))
	case c.Replicas < 3:
		d.Failover = fmt.Sprintf("%d replica(s): the loss of the server holding the bucket loses availability, and its disk the locks and tokens", c.Replicas)
		d.Warnings = append(d.Warnings, fmt.Sprintf("bucket %q has %d replica(s): no failover; use replicas=3 on a cluster of three", b.bucket, c.Replicas))
	default:
		d.Failover = fmt.Sprintf("%d replicas (Raft): a write is acknowledged once a majority stored it, so the loss of the stream's leader loses no grant; an OS crash or power loss of a majority at once can lose acknowledged grants unless the servers run with jetstream sync_interval: always", c.Replicas)
	}
	return d
}

// Guarantees implements driver.Guarantor. It reads the bucket's stream
// (STREAM.INFO) and judges:
//
//   - durable-tokens: met with file storage and three or more replicas
//     (a grant is acknowledged once a majority stored it: the loss of any
//     one server, or a kill -9 of every server process, loses none; an OS
//     crash or power loss of a majority at once can, unless the servers
//     fsync every write, sync_interval: always, which the Observed text
//     says and a client cannot read); file storage
//     on one server keeps tokens across a restart of the process, but the
//     server fsyncs every two minutes by default (sync_interval, which a
//     client cannot read), so an OS crash may lose acknowledged grants:
//     not met; memory storage: not met;
//   - failover: met with file storage and three or more replicas;
//   - server-clock: met (per-message TTLs, judged by the server).
func (b *Backend) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	si, err := b.streamInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("nats: reading the bucket's stream: %w", err)
	}
	c := si.Config
	seen := fmt.Sprintf("bucket %q: %s storage, %d replica(s)", b.bucket, c.Storage, c.Replicas)
	replicated := c.Storage == "file" && c.Replicas >= 3
	durable := driver.Measurement{Met: replicated, Observed: seen}
	failover := driver.Measurement{Met: replicated, Observed: seen}
	switch {
	case replicated:
		durable.Observed += ": a grant is acknowledged once a majority stored it; an OS crash or power loss of a majority of the servers at once can lose acknowledged grants unless they run with jetstream sync_interval: always (a client cannot read it)"
	case c.Storage != "file":
		durable.Observed += ": a server restart loses every lock and token"
		durable.Fix = "use a bucket with file storage (storage=file, the default), replicas=3"
		failover.Fix = durable.Fix
	case c.Replicas < 3:
		durable.Observed += ": tokens survive a restart of the server process, but an OS crash may lose grants the server had not synced (sync_interval, default 2m)"
		durable.Fix = "use a bucket with replicas=3 on a cluster of three servers (or run the server with jetstream sync_interval: always)"
		failover.Fix = "use a bucket with replicas=3 on a cluster of three servers"
	}
	return map[driver.Guarantee]driver.Measurement{
		driver.DurableTokens: durable,
		driver.Failover:      failover,
		driver.ServerClock:   {Met: true, Observed: "expiry judged by the NATS server (per-message TTLs)"},
	}, nil
}
