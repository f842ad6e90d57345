package mysql_test

import (
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// A released row is free to every reader, even when its release (and its
// grant) came after the reader's statement took UTC_TIMESTAMP(6): its
// expires_at, moved back to its locked_at, is then later than the
// reader's now. The row is set to that state directly, as the race
// leaves it (a grant and release committed between a reader's statement
// start and its read). Read as held (with no metadata, since a release
// clears it), a read-write lock's TryRLock took the released gate for a
// writer's record and refused. Mutation caught: Inspect and List judging
// liveness by expires_at > UTC_TIMESTAMP(6) alone.
func TestReleasedRowIsFreeToReadersWhoseNowCameFirst(t *testing.T) {
	ctx, b, base, table := openTable(t)
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Minute, Metadata: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	db := rawDB(t, base)
	defer db.Close()
	if _, err := db.ExecContext(ctx, "UPDATE `"+table+"` SET locked_at = UTC_TIMESTAMP(6) + INTERVAL 10 SECOND, expires_at = UTC_TIMESTAMP(6) + INTERVAL 10 SECOND WHERE lock_key = 'k'"); err != nil {
		t.Fatal(err)
	}
	if info, err := b.Inspect(ctx, "k"); err != nil || info.Owner != "" {
		t.Errorf("Inspect of a released row = %+v, %v; want free", info, err)
	}
	if infos, err := b.List(ctx, ""); err != nil || len(infos) != 0 {
		t.Errorf("List with a released row = %+v, %v; want none", infos, err)
	}
	if info, err := b.ForceRelease(ctx, "k"); err != nil || info.Owner != "" {
		t.Errorf("ForceRelease of a released row = %+v, %v; want nobody removed", info, err)
	}
}
