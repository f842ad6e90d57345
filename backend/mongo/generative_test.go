package mongo_test

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/driver"
)

// TestGenerative runs the generative conformance mode (random programs,
// faults at the driver boundary, histories checked with a fence in the
// loop) against each MongoDB-wire server under test. Every property must
// hold on every server: nothing is marked known.
//
// Every client dials through a generative.Staller, so that the programs
// that stall the store stall the hello round trips of the server-clock
// estimate too: one Staller per stream of programs (Options.PerStream),
// so that a program's stall reaches its own clients and never those of
// the programs running beside it, whose timing checks cannot see it. And
// clients open differently configured Backends on the one store (a clock
// estimate refreshed every second, its least). Every Backend collects garbage at GarbageAfter's least: the
// value belongs to the collection, and a Backend given another one is
// refused (TestGarbageAfterBelongsToTheCollection).
func TestGenerative(t *testing.T) {
	eachServer(t, func(t *testing.T, _ server, raw string) {
		coll, ns := freshCollection(t, raw), "generative-"+randHex()
		open := func(st *generative.Staller, o mongolock.Options) func(context.Context) (driver.Backend, error) {
			o.GarbageAfter = time.Minute
			return func(ctx context.Context) (driver.Backend, error) {
				o := o // clients open concurrently
				c, err := mongo.Connect(options.Client().ApplyURI(raw).SetDialer(st))
				if err != nil {
					return nil, err
				}
				o.Database, o.Collection, o.Namespace = testDatabase, coll, ns
				b, err := mongolock.New(ctx, c, &o)
				if err != nil {
					_ = c.Disconnect(context.WithoutCancel(ctx))
					return nil, err
				}
				return ownClient{b}, nil
			}
		}
		generative.Run(t, conformance.Harness{TTL: 2 * time.Second}, &generative.Options{
			PerStream: func(int) generative.Stream {
				st := new(generative.Staller)
				return generative.Stream{
					Open: open(st, mongolock.Options{}),
					Variants: []func(context.Context) (driver.Backend, error){
						open(st, mongolock.Options{ClockResync: time.Second}),
					},
					Stall: st.Stall,
				}
			},
		})
	})
}

// ownClient is a Backend that disconnects its client when closed (New
// leaves the client to its caller).
type ownClient struct{ *mongolock.Backend }

func (b ownClient) Close() error {
	err := b.Backend.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.Client().Disconnect(ctx)
	return err
}
