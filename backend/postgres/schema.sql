-- fencelock PostgreSQL lock table.
--
-- {{TABLE}} and {{SEQUENCE}} are replaced by validated, double-quoted
-- identifiers (letters, digits and underscores, at most 63 bytes, optionally
-- schema-qualified). Get the rendered DDL with postgres.Schema(schema, table)
-- or `fencelock` tooling; the backend runs it itself unless SkipCreate is set.

-- Fencing tokens come from one sequence per table: it never resets, is never
-- rolled back, and survives restarts (after a crash it may skip ahead, never
-- back), so tokens keep increasing even after rows are swept away.
CREATE SEQUENCE IF NOT EXISTS {{SEQUENCE}} AS bigint MINVALUE 1 NO CYCLE;

-- One row per key ever locked (until swept). A released or expired row is
-- free: expires_at <= now() by the server's clock. fillfactor leaves room for
-- HOT updates: renewals touch no indexed column.
CREATE TABLE IF NOT EXISTS {{TABLE}} (
    key        text COLLATE "C" PRIMARY KEY,
    owner      text        NOT NULL,
    token      bigint      NOT NULL CHECK (token > 0),
    locked_at  timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    -- Set by the first contender that finds the key held; tells the
    -- holder's release to NOTIFY waiters.
    contended  boolean     NOT NULL DEFAULT false,
    -- The holder's metadata payload (at most 4096 bytes) and the owner
    -- that stored it: Inspect and List report metadata only while
    -- metadata_owner is the row's owner, so a holder that never set it
    -- (a version without metadata) is not shown another's.
    metadata       bytea,
    metadata_owner text,
    CHECK (expires_at >= locked_at)
) WITH (fillfactor = 70);

-- Tables created before metadata existed get its columns. ADD COLUMN
-- without a default changes only the catalog, but takes the table's ACCESS
-- EXCLUSIVE lock for a moment; the backend runs it only when a column is
-- missing.
ALTER TABLE {{TABLE}} ADD COLUMN IF NOT EXISTS metadata bytea, ADD COLUMN IF NOT EXISTS metadata_owner text;
