package mongo

import (
	"context"
	"fmt"

	"github.com/fencelock/fencelock/driver"
	"go.mongodb.org/mongo-driver/v2/bson"
)

var _ driver.Guarantor = (*Backend)(nil)

// Guarantees implements driver.Guarantor. It asks the server (hello) for
// its replica set, and judges with the backend's write concern and the
// server kind buildInfo reported at Open:
//
//   - durable-tokens: met with j:true on MongoDB (the journal is flushed
//     before a write is acknowledged); on FerretDB the durability is that
//     of its own storage, which fencelock cannot read: unknown, not met;
//   - failover: met with w:majority and j:true on a replica-set member;
//   - server-clock: met (expiry judged by the server's clock, estimated
//     from hello.localTime within ClockBound).
func (b *Backend) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	var hello struct {
		SetName string `bson:"setName"`
	}
	if err := b.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return nil, fmt.Errorf("mongo: hello: %w", err)
	}
	wc := b.o.WriteConcern
	w, journal := "", false
	if wc != nil {
		w = fmt.Sprint(wc.W)
		journal = wc.Journal != nil && *wc.Journal
	}
	server := "MongoDB " + b.version
	if b.ferret {
		server = "FerretDB (MongoDB " + b.version + " wire protocol)"
	}
	set := "standalone (no replica set)"
	if hello.SetName != "" {
		set = "replica set " + fmt.Sprintf("%q", hello.SetName)
	}
	observed := fmt.Sprintf("%s, %s, write concern w:%s j:%v", server, set, w, journal)
	durable := driver.Measurement{Met: journal && !b.ferret, Observed: observed}
	switch {
	case b.ferret:
		durable.Observed += ": FerretDB stores in its own backend (PostgreSQL or SQLite), whose durability settings fencelock cannot read"
		durable.Fix = "use MongoDB with j:true, or check FerretDB's storage yourself (PostgreSQL fsync and synchronous_commit on) and do not require durable-tokens here"
	case !journal:
		durable.Fix = "use a write concern with j:true (the default when Options.WriteConcern is unset)"
	}
	failover := driver.Measurement{Met: !b.ferret && hello.SetName != "" && w == "majority" && journal, Observed: observed}
	if !failover.Met {
		failover.Fix = "run a replica set of 3 or more members and use w:majority with j:true (the backend's default write concern)"
	}
	return map[driver.Guarantee]driver.Measurement{
		driver.DurableTokens: durable,
		driver.Failover:      failover,
		driver.ServerClock:   {Met: true, Observed: fmt.Sprintf("expiry judged by the server's clock, estimated from hello.localTime (± %v)", b.clock.Bound())},
	}, nil
}
