package postgres

import "strings"

// queries are the backend's statements with the validated, quoted
// identifiers filled in. Values always travel as parameters.
type queries struct {
	acquireFree, acquire, renew, renewBatch, release, forceRelease, inspect, list, sweep string
	acquireBatch, releaseBatch                                                           string
}

// remainingUS is the time a row has left, in microseconds, by the server's
// clock.
const remainingUS = `(extract(epoch from (%E - now())) * 1000000)::bigint`

// metadataOf is a row's metadata as Inspect and List report it: only while
// the owner that stored it holds the row. A process of a version without
// metadata that takes over an expired row leaves the previous holder's
// payload behind (its statements do not know the columns); this hides it.
const metadataOf = `CASE WHEN metadata_owner = owner THEN metadata END`

// live is the condition of a held row for a reader that is not its
// holder (Inspect, List, ForceRelease): not ended by now(), and not
// released. A released row's expires_at is its locked_at, which may be
// later than now(): now() was read when the reader's statement began,
// and the row may have been granted and released after that, before the
// statement read it. Its holder's own calls (renew, release) come after
// its grant, so expires_at > now() alone judges them.
const live = `expires_at > now() AND expires_at > locked_at`

// takeOver is the DO UPDATE of both acquire statements. The conflict path
// draws a fresh token inside it, that is, after the row lock is taken and
// the previous holder's statement has committed, so it is above every
// token issued before. The same owner re-acquiring a live row keeps its
// token (an idempotent retry). A row another owner holds keeps everything
// but gets its contended flag set. The metadata is replaced wherever its
// owner is (a new holder, or the same owner's retry).
//
// A row is free once it has ended and, if it ended without a release, its
// lock delay ($5, microseconds; 0 for none) has passed too (free below). A
// release sets expires_at to locked_at, which no grant or renewal does
// (their expires_at is now() plus a positive TTL), so expires_at >
// locked_at on an ended row means it expired: an unreleased end.
const takeOver = `
    token      = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now() THEN l.token
                      WHEN {FREE} OR l.owner = EXCLUDED.owner THEN nextval({S})
                      ELSE l.token END,
    locked_at  = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now() THEN l.locked_at
                      WHEN {FREE} OR l.owner = EXCLUDED.owner THEN now()
                      ELSE l.locked_at END,
    contended  = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now() THEN l.contended
                      WHEN {FREE} OR l.owner = EXCLUDED.owner THEN false
                      ELSE true END,
    metadata   = CASE WHEN {FREE} OR l.owner = EXCLUDED.owner THEN EXCLUDED.metadata ELSE l.metadata END,
    metadata_owner = CASE WHEN {FREE} OR l.owner = EXCLUDED.owner THEN EXCLUDED.owner ELSE l.metadata_owner END,
    owner      = CASE WHEN {FREE} OR l.owner = EXCLUDED.owner THEN EXCLUDED.owner ELSE l.owner END,
    expires_at = CASE WHEN {FREE} OR l.owner = EXCLUDED.owner THEN EXCLUDED.expires_at ELSE l.expires_at END`

// free is the condition that row R is free for an acquire with lock delay
// $5: ended, and released or past the delay after its expiry.
func free(r string) string {
	return strings.ReplaceAll(`(R.expires_at <= now() AND (R.expires_at = R.locked_at OR R.expires_at + $5::bigint * interval '1 microsecond' <= now()))`, "R.", r+".")
}

// delayLeft is the rest of row R's lock delay, in microseconds, when R
// has ended and another owner than $2 holds it (0 otherwise; a released
// row's delay has ended).
func delayLeft(r string) string {
	return `CASE WHEN ` + r + `.owner <> $2 AND ` + r + `.expires_at <= now() AND ` + r + `.expires_at > ` + r + `.locked_at THEN ` +
		rem(r+".expires_at + $5::bigint * interval '1 microsecond'") + ` ELSE 0 END`
}

// batchDelay is the lock delay (microseconds) of acquireBatch's request
// for row l's key.
const batchDelay = `(SELECT r.delay FROM r WHERE r.key = l.key)`

func rem(col string) string { return strings.ReplaceAll(remainingUS, "%E", col) }

func buildQueries(n names) queries {
	r := strings.NewReplacer("{T}", n.table, "{S}", n.seqLit, "{FREE}", free("l"))
	q := queries{
		// acquireFree is acquire's INSERT (a below) alone: no snapshot
		// read, no CTE, the cheapest statement for a key that is free (or
		// ours). Its proposed row draws a token on every call, skipped on
		// a conflict (a gap in the sequence); takeOver draws again. On a
		// key another owner holds it goes through takeOver, which sets the
		// contended flag (rewriting the row, a write and a commit flush,
		// as acquire's m does for the first waiter per holder) and
		// RETURNING names the holder. Acquire sends it only for keys it
		// has not found held (heldHints), so a waiter's later attempts are
		// acquire's read-only ones.
		acquireFree: `INSERT INTO {T} AS l (key, owner, token, locked_at, expires_at, contended, metadata, metadata_owner)
  VALUES ($1, $2, nextval({S}), now(), now() + $3::bigint * interval '1 microsecond', false, $4::bytea, $2)
  ON CONFLICT (key) DO UPDATE SET ` + takeOver + `
  RETURNING l.owner = $2, l.token, l.owner, ` + rem("l.expires_at") + `, true, ` + delayLeft("l"),

		// acquire answers every case in one statement. A held key is
		// answered from the statement's snapshot (cur) without inserting
		// or drawing a token: a waiter's failed attempt is a read-only
		// transaction (no WAL, no commit flush), except that the first
		// one per holder sets the row's contended flag (m), which tells
		// the holder's release to NOTIFY. Otherwise the INSERT path (a)
		// draws its token when the row does not exist, and the conflict
		// path is takeOver. Both acquire statements return a fifth
		// column, marked: false when acquire answered "held" from its
		// snapshot but could not mark the row, because the row changed
		// after the snapshot (a release committed in between, with no
		// NOTIFY since nobody had marked it); Acquire then asks again
		// with acquireFree, which decides under the row lock.
		// A row in its lock delay is answered "held" from the snapshot
		// too, as marked: no release will come to NOTIFY about.
		acquire: `WITH cur AS (
  SELECT owner, token, locked_at, expires_at, contended FROM {T} WHERE key = $1
), m AS (
  UPDATE {T} SET contended = true
  WHERE key = $1 AND expires_at > now() AND owner <> $2 AND NOT contended
    AND EXISTS (SELECT 1 FROM cur WHERE cur.expires_at > now() AND cur.owner <> $2)
  RETURNING 1
), a AS (
  INSERT INTO {T} AS l (key, owner, token, locked_at, expires_at, contended, metadata, metadata_owner)
  SELECT $1, $2, nextval({S}), now(), now() + $3::bigint * interval '1 microsecond', false, $4::bytea, $2
  WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.owner <> $2 AND NOT ` + free("cur") + `)
  ON CONFLICT (key) DO UPDATE SET ` + takeOver + `
  RETURNING l.owner = $2, l.token, l.owner, ` + rem("l.expires_at") + `, true, ` + delayLeft("l") + `
)
SELECT * FROM a
UNION ALL
SELECT false, token, owner, ` + rem("expires_at") + `, contended OR expires_at <= now() OR EXISTS (SELECT 1 FROM m), ` + delayLeft("cur") + ` FROM cur
  WHERE NOT EXISTS (SELECT 1 FROM a)`,

		// acquireBatch is acquireFree for many keys at once (distinct,
		// in key order, so that two batches take their row locks in one
		// order): the rows come from unnest'ed arrays, one statement and
		// one commit for the batch. An upsert's DO UPDATE sees only the
		// proposed row (EXCLUDED), which has no column for the lock
		// delay: takeOver's free test reads each key's own from r. The
		// RETURNING names each key's holder after the statement; Go
		// compares it with the request's owner, and the delay column is
		// the rest of the row's lock delay if it ended unreleased.
		acquireBatch: `WITH r AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[], $5::bigint[]) AS r(key, owner, ttl, md, delay)
)
INSERT INTO {T} AS l (key, owner, token, locked_at, expires_at, contended, metadata, metadata_owner)
  SELECT r.key, r.owner, nextval({S}), now(), now() + r.ttl * interval '1 microsecond', false, r.md, r.owner FROM r ORDER BY r.key
  ON CONFLICT (key) DO UPDATE SET ` + strings.ReplaceAll(takeOver, "{FREE}", strings.ReplaceAll(free("l"), "$5::bigint", batchDelay)) + `
  RETURNING l.key, l.owner, l.token, ` + rem("l.expires_at") + `,
    CASE WHEN l.expires_at <= now() AND l.expires_at > l.locked_at THEN ` + rem("l.expires_at + "+batchDelay+" * interval '1 microsecond'") + ` ELSE 0 END`,

		// releaseBatch is release for many grants at once; a grant
		// missing from the result is not held.
		releaseBatch: `UPDATE {T} AS l SET locked_at = least(l.locked_at, now()), expires_at = least(l.locked_at, now()),
    metadata = NULL, metadata_owner = NULL
  FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS g(key, owner, token) ORDER BY key) AS g
  WHERE l.key = g.key AND l.owner = g.owner AND l.token = g.token AND l.expires_at > now()
  RETURNING l.key, l.owner, g.token, CASE WHEN l.contended THEN pg_notify($4, l.key)::text END`,

		// With $6 (SetMetadata) the same owner- and token-checked UPDATE
		// replaces the metadata: no read-then-write for a takeover to
		// slip between.
		renew: `UPDATE {T} SET
    expires_at = now() + $4::bigint * interval '1 microsecond',
    token = CASE WHEN $5::boolean THEN nextval({S}) ELSE token END,
    metadata = CASE WHEN $6::boolean THEN $7::bytea ELSE metadata END,
    metadata_owner = CASE WHEN $6::boolean THEN owner ELSE metadata_owner END
  WHERE key = $1 AND owner = $2 AND token = $3 AND expires_at > now()
  RETURNING token`,

		renewBatch: `UPDATE {T} AS l SET
    expires_at = now() + $4::bigint * interval '1 microsecond',
    token = CASE WHEN $5::boolean THEN nextval({S}) ELSE l.token END
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS g(key, owner, token)
  WHERE l.key = g.key AND l.owner = g.owner AND l.token = g.token AND l.expires_at > now()
  RETURNING l.key, l.owner, g.token, l.token`,

		// A released row stays, free: expires_at is moved back to
		// locked_at (never after now(), so it is free even if the server's
		// clock stepped back), which keeps the CHECK satisfied. Waiters are
		// notified only if one has marked the row contended: NOTIFY
		// serialises the commits of notifying transactions server-wide, so
		// an uncontended release does not pay for it. The NOTIFY is in
		// the RETURNING, evaluated for the released row only, so the
		// release is one statement without a CTE.
		release: `UPDATE {T} SET locked_at = least(locked_at, now()), expires_at = least(locked_at, now()),
    metadata = NULL, metadata_owner = NULL
  WHERE key = $1 AND owner = $2 AND token = $3 AND expires_at > now()
  RETURNING CASE WHEN contended THEN pg_notify($4, key)::text END`,

		forceRelease: `WITH o AS (
  SELECT key, owner, token, expires_at FROM {T} WHERE key = $1 AND ` + live + ` FOR UPDATE
), r AS (
  UPDATE {T} AS l SET locked_at = least(l.locked_at, now()), expires_at = least(l.locked_at, now()),
    metadata = NULL, metadata_owner = NULL
  FROM o WHERE l.key = o.key AND l.owner = o.owner AND l.token = o.token
  RETURNING l.key, l.owner, l.token, o.expires_at
)
SELECT owner, token, ` + rem("expires_at") + `, pg_notify($2, key) FROM r`,

		// Metadata is reported only if the row's owner stored it (see
		// metadataOf).
		inspect: `SELECT owner, token, ` + rem("expires_at") + `, ` + metadataOf + ` FROM {T} WHERE key = $1 AND ` + live,

		// starts_with on a COLLATE "C" key can use the primary key index
		// (PostgreSQL 15+); no LIKE, so no metacharacters to escape.
		list: `SELECT key, owner, token, ` + rem("expires_at") + `, ` + metadataOf + ` FROM {T}
  WHERE starts_with(key, $1) AND ` + live + ` ORDER BY key`,

		sweep: `DELETE FROM {T} WHERE expires_at < now() - $1::bigint * interval '1 microsecond'`,
	}
	for _, p := range []*string{&q.acquireBatch, &q.releaseBatch, &q.acquireFree, &q.acquire, &q.renew, &q.renewBatch, &q.release, &q.forceRelease, &q.inspect, &q.list, &q.sweep} {
		*p = r.Replace(*p)
	}
	return q
}
