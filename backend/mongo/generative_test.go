package mongo_test

import (
	"context"
	"testing"
	"time"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/driver"
)

// TestGenerative runs the generative conformance mode (random programs,
// faults at the driver boundary, histories checked with a fence in the
// loop) against the MongoDB-wire server under test.
func TestGenerative(t *testing.T) {
	raw := testURL(t)
	locks, tokens := freshCollections(t, raw)
	u := withParams(t, raw, "database", testDatabase, "collection", locks, "token_collection", tokens,
		"namespace", "generative-"+randHex())
	var o generative.Options
	if isFerretDB(t, raw) {
		// Documented in docs/backends/mongo.md and the safety report:
		// FerretDB runs an update as a read followed by an unconditional
		// write, so two contenders taking over one expired key can both
		// win, with the same token. Until the backend rests on unique
		// inserts alone (the open MongoDB issue), these are measured,
		// not failed; every other property must hold.
		const why = "FerretDB's non-atomic takeover"
		o.Known = map[string]string{
			"NoTwoHolders": why, "TokensIncreaseAcrossHolders": why, "NoStaleWriteAccepted": why,
			"LiveHolderWritesAccepted": why, "NoLossWithoutCause": why,
		}
	}
	generative.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) { return mongolock.Open(ctx, u) },
		TTL:  2 * time.Second,
	}, &o)
}
