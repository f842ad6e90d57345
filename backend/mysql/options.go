package mysql

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"strings"

	"github.com/fencelock/fencelock/internal/backendkit"
)

// DefaultTable is the lock table's name when Options.Table is empty.
const DefaultTable = "fencelock_locks"

// maxTable is the longest table name: the derived names (Table +
// "_acquire", "_tokens", "_rotate") must fit in MySQL's 64-character
// identifiers.
const maxTable = 48

// Options configures a Backend. A nil *Options, and every zero field, means
// the documented default.
type Options struct {
	// Table is the lock table, in the connection's database. Default
	// DefaultTable ("fencelock_locks"). It must be letters, digits and
	// underscores, not start with a digit, and be at most 48 bytes; the
	// backend also uses Table + "_tokens" (the token counter) and the
	// procedures Table + "_acquire" and Table + "_rotate".
	Table string

	// SkipCreate, if true, makes New and Open leave the DDL to a DBA (see
	// Schema) and only check that the tables and procedures exist, in
	// their current version. Default false: whatever is missing or
	// outdated is created (serialised with GET_LOCK).
	SkipCreate bool
}

// names are the resolved, backquoted identifiers.
type names struct {
	table, tokens, acquire, rotate string // quoted
	rawTable, rawTokens            string
	rawAcquire, rawRotate          string
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
	return resolveNames(r.Table)
}

func resolveNames(table string) (names, error) {
	if table == "" {
		table = DefaultTable
	}
	if err := backendkit.CheckIdent("Table", table, maxTable, "the derived names, Table + \"_acquire\", must fit in MySQL's 64"); err != nil {
		return names{}, err
	}
	n := names{rawTable: table, rawTokens: table + "_tokens", rawAcquire: table + "_acquire", rawRotate: table + "_rotate"}
	n.table, n.tokens, n.acquire, n.rotate = quote(n.rawTable), quote(n.rawTokens), quote(n.rawAcquire), quote(n.rawRotate)
	return n, nil
}

func quote(ident string) string { return "`" + ident + "`" }

//go:embed schema.sql
var schemaTemplate string

// procVersion identifies the procedures' text: a procedure whose COMMENT
// names another version is replaced (or, with SkipCreate, refused).
var procVersion = func() string {
	s := sha256.Sum256([]byte(schemaTemplate))
	return "v1-" + hex.EncodeToString(s[:6])
}()

// Schema returns the DDL for the lock table table ("" means DefaultTable):
// CREATE TABLE … IF NOT EXISTS for the lock table and its token counter,
// the counter's row, and the two procedures (dropped and created again),
// for teams whose applications may not run DDL. Statements are separated
// by lines that hold only "-- ;;"; run them one by one (the procedures
// contain semicolons), or with the mariadb client after DELIMITER ;; and
// replacing each separator line by ";;". The identifier is validated
// exactly as Options.Table is; an invalid one returns a
// *driver.InvalidOptionError.
func Schema(table string) (string, error) {
	n, err := resolveNames(table)
	if err != nil {
		return "", err
	}
	return n.ddl(), nil
}

func (n names) ddl() string {
	return strings.NewReplacer("{{TABLE}}", n.table, "{{TOKENS}}", n.tokens, "{{ACQUIRE}}", n.acquire,
		"{{ROTATE}}", n.rotate, "{{VERSION}}", procVersion).Replace(schemaTemplate)
}

// statements splits the DDL at its separator lines.
func (n names) statements() []string {
	var out []string
	for _, s := range strings.Split(n.ddl(), "\n-- ;;\n") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
