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
// loop) against each MongoDB-wire server under test. Every property must
// hold on every server: nothing is marked known.
func TestGenerative(t *testing.T) {
	eachServer(t, func(t *testing.T, _ server, raw string) {
		u := withParams(t, raw, "database", testDatabase, "collection", freshCollection(t, raw),
			"namespace", "generative-"+randHex())
		generative.Run(t, conformance.Harness{
			Open: func(ctx context.Context) (driver.Backend, error) { return mongolock.Open(ctx, u) },
			TTL:  2 * time.Second,
		}, nil)
	})
}
