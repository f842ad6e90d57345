package mongo_test

import (
	"context"
	"sync"
	"testing"
	"time"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
	"github.com/fencelock/fencelock/driver"
)

// TestReadRacingReleaseNeverShowsAnOlderState: a read of a key (Inspect,
// List) whose find of the record came before the holder's release, and
// whose find of the record's epoch claims came after it, reports the key
// free — never the record as it was acquired (its first token and
// metadata, before the renewals that rotated the token and set new
// metadata), a state the store had left before the read began. Observe
// (recipe) reads with Inspect: it delivered such a read as the leader's
// older state after its newer one.
func TestReadRacingReleaseNeverShowsAnOlderState(t *testing.T) {
	eachServer(t, testReadRacingReleaseNeverShowsAnOlderState)
}

func testReadRacingReleaseNeverShowsAnOlderState(t *testing.T, _ server, raw string) {
	holder, u := openTest(t, raw)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ttl = time.Minute
	for _, read := range []string{"inspect", "list"} {
		t.Run(read, func(t *testing.T) {
			key := "race/" + read
			g, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "leader-" + read, TTL: ttl, Metadata: []byte("v0")})
			if err != nil {
				t.Fatal(err)
			}
			if g, err = holder.Renew(ctx, g, driver.RenewRequest{TTL: ttl, Rotate: true, SetMetadata: true, Metadata: []byte("v1")}); err != nil {
				t.Fatal(err)
			}
			if g, err = holder.Renew(ctx, g, driver.RenewRequest{TTL: ttl}); err != nil {
				t.Fatal(err)
			}
			reader, err := mongolock.Open(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			defer reader.Close()
			var once sync.Once
			reader.PauseBetweenReads(func() {
				// The holder releases between the reader's two finds.
				once.Do(func() {
					if err := holder.Release(ctx, g); err != nil {
						t.Errorf("Release: %v", err)
					}
				})
			})
			var got driver.Info
			switch read {
			case "inspect":
				got, err = reader.Inspect(ctx, key)
			case "list":
				var l []driver.Info
				l, err = reader.List(ctx, key)
				if len(l) > 0 {
					got = l[0]
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Owner != "" {
				t.Fatalf("%s racing the release reported %q token %d metadata %q (the record as acquired); want the key free (the holder was at token %d, metadata \"v1\")",
					read, got.Owner, got.Token, got.Metadata, g.Token)
			}
		})
	}
}
