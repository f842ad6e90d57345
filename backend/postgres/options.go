package postgres

import (
	_ "embed"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultTable is the lock table's name when Options.Table is empty.
const DefaultTable = "fencelock_locks"

// maxIdent is PostgreSQL's identifier limit (NAMEDATALEN − 1). Longer names
// would be truncated silently by the server, so they are rejected instead.
const maxIdent = 63

// Options configures a Backend. A nil *Options, and every zero field, means
// the documented default. Identifiers (Schema, Table, Sequence, Channel)
// must be letters, digits and underscores, not start with a digit, and be at
// most 63 bytes; they are always double-quoted in SQL, so they are
// case-sensitive.
type Options struct {
	// Schema holds the table and its sequence. Default "": unqualified
	// names, resolved through the connection's search_path (give every
	// process the same search_path, or set Schema).
	Schema string

	// Table is the lock table. Default DefaultTable ("fencelock_locks").
	Table string

	// Sequence issues fencing tokens. Default Table + "_token_seq", which
	// must then fit in 63 bytes.
	Sequence string

	// Channel is the LISTEN/NOTIFY channel on which releases are announced.
	// Default Table. Backends that share a table must share the channel.
	Channel string

	// SkipCreate, if true, makes New and Open leave the DDL to a DBA (see
	// Schema) and only check that the table exists. Default false: the
	// table and sequence are created if missing (CREATE … IF NOT EXISTS,
	// serialised with a transaction-scoped advisory lock).
	SkipCreate bool

	// RenewPool, if set, is used for renewals instead of the main pool, so
	// that a busy application pool cannot starve heartbeats. The caller
	// owns it; Close does not close it. Open sets it to a small pool of its
	// own that keeps one connection idle, with the renewal statements
	// prepared, so that a renewal never waits for a connection to be
	// opened (give a pool of your own MinIdleConns ≥ 1 for the same
	// reason). Default (New): the main pool; if the application can
	// exhaust it for longer than a lease's local validity, renewals wait
	// and the lease is lost.
	RenewPool *pgxpool.Pool

	// ListenConfig is the connection used for LISTEN (waking waiters). It
	// must reach the server directly, not through a transaction-pooling
	// PgBouncer. Default: a copy of the main pool's connection config.
	ListenConfig *pgx.ConnConfig

	// NoListen disables LISTEN/NOTIFY waiting: waiters poll with backoff
	// and releases still send notifications for other processes. Default
	// false.
	NoListen bool
}

// names are the resolved, quoted identifiers.
type names struct {
	table    string // "schema"."table" or "table"
	seq      string // same shape
	seqLit   string // SQL literal: '"schema"."seq"'
	channel  string // unquoted (passed as a parameter to pg_notify)
	lchannel string // quoted for LISTEN
	rawTable string
	rawSeq   string
	schema   string
}

// Validate reports the first option that is out of range, as a
// *driver.InvalidOptionError.
func (o *Options) Validate() error {
	_, err := o.resolve()
	return err
}

func (o *Options) resolve() (names, error) {
	var r Options
	if o != nil {
		r = *o
	}
	return resolveNames(r.Schema, r.Table, r.Sequence, r.Channel)
}

func resolveNames(schema, table, seq, channel string) (names, error) {
	if table == "" {
		table = DefaultTable
	}
	if seq == "" {
		seq = table + "_token_seq"
		if len(seq) > maxIdent {
			return names{}, &driver.InvalidOptionError{Option: "Sequence", Value: strconv.Quote(seq),
				Reason: "the default name (Table + \"_token_seq\") is longer than 63 bytes: set Sequence"}
		}
	}
	if channel == "" {
		channel = table
	}
	if schema != "" {
		if err := backendkit.CheckIdent("Schema", schema, maxIdent, "PostgreSQL's identifier limit"); err != nil {
			return names{}, err
		}
	}
	for _, c := range []struct{ opt, v string }{{"Table", table}, {"Sequence", seq}, {"Channel", channel}} {
		if err := backendkit.CheckIdent(c.opt, c.v, maxIdent, "PostgreSQL's identifier limit"); err != nil {
			return names{}, err
		}
	}
	n := names{channel: channel, lchannel: quote(channel), rawTable: table, rawSeq: seq, schema: schema}
	n.table, n.seq = quote(table), quote(seq)
	if schema != "" {
		n.table = quote(schema) + "." + n.table
		n.seq = quote(schema) + "." + n.seq
	}
	n.seqLit = "'" + n.seq + "'"
	return n, nil
}

// quote double-quotes an identifier that checkIdent accepted.
func quote(ident string) string { return `"` + ident + `"` }

//go:embed schema.sql
var schemaTemplate string

// Schema returns the DDL (CREATE SEQUENCE and CREATE TABLE, both IF NOT
// EXISTS, then ALTER TABLE … ADD COLUMN IF NOT EXISTS for the columns added
// since the table's first version, so the same DDL also upgrades an
// existing table) for the lock table schema.table ("" schema: unqualified;
// "" table: DefaultTable), for teams whose applications may not run DDL. The
// identifiers are validated exactly as Options are; invalid ones return a
// *driver.InvalidOptionError.
func Schema(schema, table string) (string, error) {
	n, err := resolveNames(schema, table, "", "")
	if err != nil {
		return "", err
	}
	return n.ddl(), nil
}

func (n names) ddl() string {
	return strings.NewReplacer("{{TABLE}}", n.table, "{{SEQUENCE}}", n.seq).Replace(schemaTemplate)
}

// migration is the ALTER TABLE of the DDL (schema.sql's last statement),
// which adds the columns of later versions to an existing table.
func (n names) migration() string {
	for _, line := range strings.Split(n.ddl(), "\n") {
		if strings.HasPrefix(line, "ALTER TABLE ") {
			return line
		}
	}
	panic("postgres: schema.sql has no ALTER TABLE")
}
