package mongo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// TestLateCallOfEndedGrantLeavesNextHolder: a renewal of a grant whose
// lease has ended (released, or cut short by a minimum-hold renewal and
// then taken over) that reaches the store after the next holder of the
// key acquired it — on the same Backend, as one client's consecutive
// leases do — is refused with ErrNotHeld, and the next holder keeps the
// key: it renews (with metadata too), its record still names it, and its
// release succeeds. Every renewal form is tried: plain, with metadata,
// rotating, batched, and with either the grant's last handle or an
// earlier one.
func TestLateCallOfEndedGrantLeavesNextHolder(t *testing.T) {
	eachServer(t, testLateCallOfEndedGrantLeavesNextHolder)
}

func testLateCallOfEndedGrantLeavesNextHolder(t *testing.T, _ server, raw string) {
	b, _ := openTest(t, raw)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const key = "slot/.permit/0"
	const ttl = 10 * time.Second
	stale := []struct {
		name string
		req  driver.RenewRequest
	}{
		{"renew", driver.RenewRequest{TTL: ttl}},
		{"renew-metadata", driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: []byte("old")}},
		{"renew-rotate", driver.RenewRequest{TTL: ttl, Rotate: true}},
	}
	for _, ending := range []string{"released", "taken-over"} {
		for _, s := range stale {
			for _, batch := range []bool{false, true} {
				name := ending + "/" + s.name
				if batch {
					name += "/batch"
				}
				t.Run(name, func(t *testing.T) {
					if batch && (s.req.Rotate || s.req.SetMetadata) {
						t.Skip("RenewBatch renews these alone, with Renew")
					}
					first, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "old-" + name, TTL: ttl})
					if err != nil {
						t.Fatal(err)
					}
					renewed, err := b.Renew(ctx, first, driver.RenewRequest{TTL: ttl})
					if err != nil {
						t.Fatal(err)
					}
					switch ending {
					case "released":
						if err := b.Release(ctx, renewed); err != nil {
							t.Fatal(err)
						}
					case "taken-over":
						// A release inside a minimum hold: a renewal
						// with a short TTL, after which the record
						// expires and the next holder takes it over.
						short, err := b.Renew(ctx, renewed, driver.RenewRequest{TTL: 200 * time.Millisecond})
						if err != nil {
							t.Fatal(err)
						}
						renewed = short
					}
					var next driver.Grant
					for {
						next, err = b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "new-" + name, TTL: ttl})
						if err == nil {
							break
						}
						if !errors.Is(err, driver.ErrNotAcquired) {
							t.Fatal(err)
						}
						select {
						case <-ctx.Done():
							t.Fatalf("next holder never acquired: %v", err)
						case <-time.After(50 * time.Millisecond): // poll: the record's expiry is the server's
						}
					}
					next, err = b.Renew(ctx, next, driver.RenewRequest{TTL: ttl})
					if err != nil {
						t.Fatal(err)
					}
					// The late calls: with the ended grant's last handle
					// and with its first.
					for _, old := range []driver.Grant{renewed, first} {
						if batch {
							res, err := b.RenewBatch(ctx, []driver.Grant{old}, s.req)
							if err != nil {
								t.Fatal(err)
							}
							err = res[0].Err
							if !errors.Is(err, driver.ErrNotHeld) {
								t.Errorf("late batch renewal of the ended grant (%s) = %+v, %v; want ErrNotHeld", old.Handle, res[0].Grant, err)
							}
						} else if g, err := b.Renew(ctx, old, s.req); !errors.Is(err, driver.ErrNotHeld) {
							t.Errorf("late renewal of the ended grant (%s) = %+v, %v; want ErrNotHeld", old.Handle, g, err)
						}
					}
					info, err := b.Inspect(ctx, key)
					if err != nil {
						t.Fatal(err)
					}
					if info.Owner != next.Owner || info.Token != next.Token {
						t.Fatalf("after the late calls the key is held by %q token %d; want the next holder %q token %d", info.Owner, info.Token, next.Owner, next.Token)
					}
					next, err = b.Renew(ctx, next, driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: []byte("new")})
					if err != nil {
						t.Fatalf("next holder's metadata renewal after the late calls: %v", err)
					}
					if err := b.Release(ctx, next); err != nil {
						t.Fatalf("next holder's release after the late calls: %v", err)
					}
				})
			}
		}
	}
}
