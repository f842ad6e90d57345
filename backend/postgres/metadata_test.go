package postgres_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// preMetadataDDL is the table as versions before lock metadata created
// it.
const preMetadataDDL = `CREATE SEQUENCE IF NOT EXISTS "%T_token_seq" AS bigint MINVALUE 1 NO CYCLE;
CREATE TABLE IF NOT EXISTS "%T" (
    key        text COLLATE "C" PRIMARY KEY,
    owner      text        NOT NULL,
    token      bigint      NOT NULL CHECK (token > 0),
    locked_at  timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    contended  boolean     NOT NULL DEFAULT false,
    CHECK (expires_at >= locked_at)
) WITH (fillfactor = 70);`

// TestMetadataMigration: a table created by a version without metadata,
// with a live lock in it, gets the metadata columns when a new backend
// opens it (not with SkipCreate, which names the DDL to run instead); the
// old lock reads back with no metadata; and a takeover by an old version's
// acquire (which does not know the columns) does not show the previous
// holder's payload as the new holder's.
func TestMetadataMigration(t *testing.T) {
	ctx := ctxT(t)
	base := testURL(t)
	table := uniqueTable(t, base)
	pool, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, strings.ReplaceAll(preMetadataDDL, "%T", table)); err != nil {
		t.Fatal(err)
	}
	// A lock held by an old version.
	if _, err := pool.Exec(ctx, `INSERT INTO "`+table+`" (key, owner, token, locked_at, expires_at)
  VALUES ('old', 'old-owner', nextval('"`+table+`_token_seq"'), now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}

	_, err = postgres.Open(ctx, withParams(t, base, "table", table, "create_table", "false"))
	if err == nil || !strings.Contains(err.Error(), "metadata") {
		t.Fatalf("Open with SkipCreate on a table without the metadata columns = %v; want an error naming them", err)
	}

	b, err := postgres.Open(ctx, withParams(t, base, "table", table))
	if err != nil {
		t.Fatalf("Open on a table without the metadata columns: %v", err)
	}
	defer b.Close()
	info, err := b.Inspect(ctx, "old")
	if err != nil || info.Owner != "old-owner" || info.Metadata != nil {
		t.Fatalf("Inspect(old lock) after the migration = %+v, %v; want old-owner with nil metadata", info, err)
	}
	// Opening again finds the columns and alters nothing.
	b2, err := postgres.Open(ctx, withParams(t, base, "table", table, "create_table", "false"))
	if err != nil {
		t.Fatalf("Open with SkipCreate after the migration: %v", err)
	}
	b2.Close()

	// A new holder stores metadata; its lock expires; an old version
	// takes the key over with its own statement, which leaves the
	// metadata columns alone.
	md := []byte("addr=10.0.0.1\x00")
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "new-owner", TTL: time.Hour, Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := b.Inspect(ctx, "k"); err != nil || !bytes.Equal(info.Metadata, md) {
		t.Fatalf("Inspect = %+v, %v; want metadata %q", info, err, md)
	}
	if _, err := pool.Exec(ctx, `UPDATE "`+table+`" SET owner = 'old-owner-2', token = nextval('"`+table+`_token_seq"'),
  locked_at = now(), expires_at = now() + interval '1 hour' WHERE key = 'k'`); err != nil {
		t.Fatal(err)
	}
	info, err = b.Inspect(ctx, "k")
	if err != nil || info.Owner != "old-owner-2" || info.Metadata != nil {
		t.Errorf("Inspect after an old version's takeover = %+v, %v; want old-owner-2 with nil metadata (not the previous holder's)", info, err)
	}
	infos, err := b.List(ctx, "k")
	if err != nil || len(infos) != 1 || infos[0].Metadata != nil {
		t.Errorf("List after an old version's takeover = %+v, %v; want one record with nil metadata", infos, err)
	}
	if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: time.Hour, SetMetadata: true, Metadata: []byte("x")}); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Renew(SetMetadata) by the displaced holder = %v; want ErrNotHeld", err)
	}
}
