package mysql

import "strings"

// queries are the backend's statements with the validated, quoted
// identifiers filled in. Values always travel as parameters. Every
// statement reads the server's clock, UTC_TIMESTAMP(6), which is fixed for
// the whole statement; the columns hold UTC, so a change of the server's
// time zone changes nothing.
type queries struct {
	acquire, rotate, renew, release, inspect, list, sweep, highKeys, highGlobal, raise string
}

// remainingUS is the time column C has left, in microseconds.
func remainingUS(c string) string { return "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), " + c + ")" }

// metadataOf is a row's metadata as Inspect and List report it: only while
// the owner that stored it holds the row.
const metadataOf = `IF(metadata_owner = owner, metadata, NULL)`

// live is the condition of a held row for a reader that is not its
// holder (Inspect, List): not ended by UTC_TIMESTAMP(6), and not
// released. A released row's expires_at is its locked_at, which may be
// later than UTC_TIMESTAMP(6): that was read when the reader's statement
// began, and the row may have been granted and released after that,
// before the statement read it. Its holder's own calls (renew, release)
// come after its grant, so expires_at > UTC_TIMESTAMP(6) alone judges
// them. A held row's expires_at may be below its locked_at (a renewal
// after the server's clock stepped back by more than the TTL: the table
// has no CHECK against it, and Acquire still finds the row held), so a
// release is told by equality, which only a release leaves.
const live = `expires_at > UTC_TIMESTAMP(6) AND expires_at <> locked_at`

func buildQueries(n names) queries {
	r := strings.NewReplacer("{T}", n.table, "{C}", n.tokens, "{A}", n.acquire, "{R}", n.rotate)
	q := queries{
		acquire: `CALL {A}(?, ?, ?, ?, ?)`,
		rotate:  `CALL {R}(?, ?, ?, ?, ?, ?)`,

		// version = version + 1 makes the row change, so that the
		// affected-row count says whether the grant was held.
		renew: `UPDATE {T} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    metadata = IF(?, ?, metadata), metadata_owner = IF(?, owner, metadata_owner), version = version + 1
  WHERE lock_key = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)`,

		// A released row stays, free: expires_at is moved back to
		// locked_at (never after now, so it is free even if the server's
		// clock stepped back), which marks the end as a release (no lock
		// delay).
		release: `UPDATE {T} SET locked_at = LEAST(locked_at, UTC_TIMESTAMP(6)), expires_at = LEAST(locked_at, UTC_TIMESTAMP(6)),
    metadata = NULL, metadata_owner = NULL, version = version + 1
  WHERE lock_key = ? AND owner = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)`,

		inspect: `SELECT owner, token, ` + remainingUS("expires_at") + `, ` + metadataOf + ` FROM {T}
  WHERE lock_key = ? AND ` + live,

		// The key column is binary: LIKE compares bytes and ORDER BY is
		// byte order; the prefix's own wildcards are escaped with '!'.
		list: `SELECT lock_key, owner, token, ` + remainingUS("expires_at") + `, ` + metadataOf + ` FROM {T}
  WHERE lock_key LIKE ? ESCAPE '!' AND ` + live + ` ORDER BY lock_key`,

		sweep: `DELETE FROM {T} WHERE expires_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND`,

		highKeys:   `SELECT lock_key, token FROM {T} WHERE lock_key LIKE ? ESCAPE '!'`,
		highGlobal: `SELECT v FROM {C} WHERE id = 1`,
		// The counter row's lock orders this with every token drawn: a
		// token drawn after it commits is above floor.
		raise: `UPDATE {C} SET v = GREATEST(v, ?) WHERE id = 1`,
	}
	for _, p := range []*string{&q.acquire, &q.rotate, &q.renew, &q.release, &q.inspect, &q.list, &q.sweep, &q.highKeys, &q.highGlobal, &q.raise} {
		*p = r.Replace(*p)
	}
	return q
}

// renewBatch is the UPDATE that renews n grants: the key list lets the
// primary key find the rows; the row constructor checks owner and token.
func (q queries) renewBatch(table string, n int) string {
	return `UPDATE ` + table + ` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, version = version + 1
  WHERE lock_key IN (` + placeholders(n, "?") + `) AND (lock_key, owner, token) IN (` + placeholders(n, "(?, ?, ?)") + `)
    AND expires_at > UTC_TIMESTAMP(6)`
}

// heldBatch reads which of n grants are held (after renewBatch).
func (q queries) heldBatch(table string, n int) string {
	return `SELECT lock_key, owner, token FROM ` + table + `
  WHERE lock_key IN (` + placeholders(n, "?") + `) AND (lock_key, owner, token) IN (` + placeholders(n, "(?, ?, ?)") + `)
    AND expires_at > UTC_TIMESTAMP(6)`
}

func placeholders(n int, one string) string {
	return strings.TrimSuffix(strings.Repeat(one+", ", n), ", ")
}
