package mysql_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/driver"
)

// A row held after the server's clock stepped back by more than its TTL
// is reported held by Inspect and List, and ForceRelease removes its
// holder, as Acquire refuses it: the holder's renewal, judged by the
// stepped clock, moved expires_at below the grant's locked_at (MySQL has
// no CHECK to refuse that, as PostgreSQL's table has), and only a
// release leaves expires_at equal to locked_at. The stepped clock is a
// second Backend whose sessions set the server's timestamp an hour back
// (the session variable timestamp: UTC_TIMESTAMP(6) reads it). Mutation
// caught: Inspect and List requiring expires_at > locked_at, which tells
// this held row for a released one.
func TestHeldRowAfterServerClockSteppedBackIsReportedHeld(t *testing.T) {
	ctx, b, base, table := openTable(t)
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	back := time.Now().Add(-time.Hour)
	stamp := strconv.FormatFloat(float64(back.UnixMicro())/1e6, 'f', 6, 64)
	stepped, err := mysql.Open(ctx, withParams(t, base, "table", table, "timestamp", stamp))
	if err != nil {
		t.Fatal(err)
	}
	defer stepped.Close()
	if _, err := stepped.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute}); err != nil {
		t.Fatalf("the holder's renewal after the clock stepped back: %v", err)
	}
	if _, err := stepped.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "other", TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("another owner's Acquire of the held row = %v; want refused", err)
	}
	if info, err := stepped.Inspect(ctx, "k"); err != nil || info.Owner != "o" {
		t.Errorf("Inspect of the held row = %+v, %v; want its holder o", info, err)
	}
	if infos, err := stepped.List(ctx, ""); err != nil || len(infos) != 1 || infos[0].Owner != "o" {
		t.Errorf("List with the held row = %+v, %v; want its holder o", infos, err)
	}
	if info, err := stepped.ForceRelease(ctx, "k"); err != nil || info.Owner != "o" {
		t.Errorf("ForceRelease of the held row = %+v, %v; want its holder o removed", info, err)
	}
	if _, err := stepped.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "other", TTL: time.Minute}); err != nil {
		t.Errorf("another owner's Acquire after ForceRelease = %v; want granted", err)
	}
}
