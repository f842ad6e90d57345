package mongo

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/fencelock/fencelock/driver"
)

// Defaults of Options.
const (
	DefaultDatabase     = "fencelock"
	DefaultCollection   = "fencelock_locks"
	DefaultNamespace    = "default"
	DefaultClockResync  = 30 * time.Second
	DefaultGarbageAfter = time.Hour
)

// TokensSuffix starts the names of the collections of token claims on
// FerretDB: Options.Collection followed by it, "_" and a two-digit shard
// number ("fencelock_locks_tokens_00" to "fencelock_locks_tokens_31" by
// default; TokenCollections lists them). Token claims are kept apart from
// the lock records so that the records' collection holds only what is
// live, and spread over TokenShards collections by key so that reading
// one key's claims scans few other keys' claims: FerretDB scans a whole
// collection for every delete and find, even by _id.
const TokensSuffix = "_tokens"

// TokenShards is the number of collections FerretDB's token claims are
// spread over. It is part of the stored layout: every Backend on a server
// must use the same number.
const TokenShards = 32

// TokenCollection returns the name of the collection that holds the
// token claims of namespace's key on FerretDB, for a records' collection
// named collection: one of TokenCollections(collection).
func TokenCollection(collection, namespace, key string) string {
	return TokenCollections(collection)[shardOf(namespace, key)]
}

// TokenCollections returns the names of the collections that hold the
// token claims of a records' collection named collection on FerretDB.
func TokenCollections(collection string) []string {
	names := make([]string, TokenShards)
	for i := range names {
		names[i] = fmt.Sprintf("%s%s_%02d", collection, TokensSuffix, i)
	}
	return names
}

// MaxNamespaceLen is the longest Options.Namespace, in bytes.
const MaxNamespaceLen = 128

// Options configures a Backend. A nil *Options, and every zero field, means
// the documented default.
type Options struct {
	// Database is the database holding the collection. Default
	// "fencelock" (Open uses the URL's path, e.g. mongodb://host/app, when
	// the database parameter is absent). 1 to 63 characters from
	// [A-Za-z0-9_-].
	Database string

	// Collection holds the lock records (one per held key) and the
	// immutable claims of record epochs; on FerretDB the token claims are
	// in the collections TokenCollections names. See the package
	// documentation. Default "fencelock_locks". 1 to 120 characters from
	// [A-Za-z0-9_.-], starting with a letter or underscore, not starting
	// with "system.", no "..".
	Collection string

	// Namespace separates applications sharing one collection (the seed's
	// BizType): keys of different namespaces never collide and List only
	// sees its own namespace. Default "default". 1 to MaxNamespaceLen bytes
	// of printable UTF-8.
	Namespace string

	// WriteConcern of every write. Default majority with journal
	// ({w: "majority", j: true}): a weaker one can lose an acknowledged
	// lock or token on a failover or crash, which Describe then warns
	// about.
	WriteConcern *writeconcern.WriteConcern

	// ReadConcern of Inspect, List and the holder look-up after a refused
	// acquire. Default majority.
	ReadConcern *readconcern.ReadConcern

	// ClockResync is how often the offset between this process's clock and
	// the server's (from the hello reply's localTime) is measured again.
	// The measurement runs inline in the first operation after the period,
	// costing it one extra round trip. Default 30s; between 1s and 1h.
	ClockResync time.Duration

	// GarbageAfter is how old a claim must be before it is deleted as
	// garbage: a token claim below its key's highest, an end claim, a
	// renewal claim that expired that long ago. The acquires that read a
	// key's claims start their deletion in the background (a key's old
	// token claims every 64th token, the rest every 1024th such acquire;
	// one batch at a time per Backend, which Close waits for), and on MongoDB a TTL index on
	// expiresAt deletes expired renewal claims. The highest token claim of
	// a key is never deleted. A token this backend claimed is used as the
	// base of its next claim for GarbageAfter/2 without reading the key's
	// claims, which assumes that no write is delayed in flight by more
	// than GarbageAfter/2 before the server applies it. Default 1h;
	// between 1 minute and 1 year. Lock records are never deleted by a TTL
	// index: an expired record counts as free and is replaced by the next
	// acquire of its key.
	//
	// The value belongs to the collection: every Backend on it must use
	// the same one (a collector with a shorter value deletes claims that a
	// Backend with a longer one still builds on). The first Backend on a
	// collection records its value there; a later one with GarbageAfter
	// zero (and every Backend opened from a URL) adopts the recorded
	// value, and one given another value is refused with a
	// *GarbageAfterError (ErrGarbageAfter), changing nothing. Options
	// returns the value in use.
	GarbageAfter time.Duration
}

var (
	dbNameRE   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,63}$`)
	collNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,119}$`)
)

func badOpt(name, value, reason string) error {
	return &driver.InvalidOptionError{Option: name, Value: strconv.Quote(value), Reason: reason}
}

func validCollection(opt, name string) error {
	if !collNameRE.MatchString(name) || strings.HasPrefix(name, "system.") || strings.Contains(name, "..") || strings.HasSuffix(name, ".") {
		return badOpt(opt, name, "must be 1 to 120 characters from [A-Za-z0-9_.-], start with a letter or underscore, not start with \"system.\", and contain no \"..\" or trailing dot")
	}
	return nil
}

// resolve returns a copy with defaults filled in, or the first violation.
func (o *Options) resolve() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Database == "" {
		r.Database = DefaultDatabase
	}
	if r.Collection == "" {
		r.Collection = DefaultCollection
	}
	if r.Namespace == "" {
		r.Namespace = DefaultNamespace
	}
	if r.WriteConcern == nil {
		j := true
		r.WriteConcern = &writeconcern.WriteConcern{W: "majority", Journal: &j}
	}
	if r.ReadConcern == nil {
		r.ReadConcern = readconcern.Majority()
	}
	if r.ClockResync == 0 {
		r.ClockResync = DefaultClockResync
	}
	if r.GarbageAfter == 0 {
		r.GarbageAfter = DefaultGarbageAfter
	}
	if !dbNameRE.MatchString(r.Database) {
		return r, badOpt("Database", r.Database, "must be 1 to 63 characters from [A-Za-z0-9_-]")
	}
	if err := validCollection("Collection", r.Collection); err != nil {
		return r, err
	}
	if len(r.Namespace) > MaxNamespaceLen {
		return r, badOpt("Namespace", r.Namespace[:32]+"…", "must be at most "+strconv.Itoa(MaxNamespaceLen)+" bytes")
	}
	if err := driver.ValidateKey(r.Namespace); err != nil {
		return r, badOpt("Namespace", r.Namespace, "must be printable UTF-8 without control characters")
	}
	if !r.WriteConcern.IsValid() {
		return r, badOpt("WriteConcern", "", "is not a valid write concern")
	}
	if !r.WriteConcern.Acknowledged() {
		return r, badOpt("WriteConcern", "w:0", "must be acknowledged: an unacknowledged write cannot grant a lock")
	}
	if r.ClockResync < time.Second || r.ClockResync > time.Hour {
		return r, &driver.InvalidOptionError{Option: "ClockResync", Value: r.ClockResync.String(), Reason: "must be between 1s and 1h"}
	}
	if r.GarbageAfter < time.Minute || r.GarbageAfter > 365*24*time.Hour {
		return r, &driver.InvalidOptionError{Option: "GarbageAfter", Value: r.GarbageAfter.String(), Reason: "must be between 1m and 1 year"}
	}
	return r, nil
}

// Validate reports the first option that is out of range, as an
// *driver.InvalidOptionError naming the rule it breaks. Zero fields are
// checked with their defaults filled in.
func (o *Options) Validate() error {
	_, err := o.resolve()
	return err
}

// weakWrites reports whether wc can lose an acknowledged write.
func weakWrites(wc *writeconcern.WriteConcern) string {
	var w []string
	if s, ok := wc.W.(string); !ok || s != "majority" {
		w = append(w, "write concern is not w:majority: an acknowledged lock or token can be rolled back on a replica-set failover")
	}
	if wc.Journal == nil || !*wc.Journal {
		w = append(w, "write concern has no j:true: an acknowledged lock or token can be lost if the server crashes before its journal is flushed")
	}
	return strings.Join(w, "; ")
}
