package nats

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencelock/fencelock/driver"
)

// DefaultBucket is the key-value bucket used when Options.Bucket is empty.
const DefaultBucket = "fencelock"

// Options configures a Backend. A nil *Options, and every zero field, means
// the documented default.
type Options struct {
	// Bucket is the JetStream key-value bucket that holds the locks (the
	// stream KV_<Bucket>). Default DefaultBucket ("fencelock"). It must
	// be 1 to 64 of A-Z a-z 0-9 '-' '_'. Backends that share a bucket
	// share locks. New creates the bucket if it does not exist, and
	// refuses one that lacks per-message TTLs or keeps more than one
	// value per key.
	Bucket string

	// Replicas is the replication factor of a bucket New creates: 1
	// (default) or 3 or 5 on a cluster. An existing bucket keeps its
	// own; Describe and Guarantees report the one in force.
	Replicas int

	// Storage is the storage of a bucket New creates:
	// jetstream.FileStorage (default) or jetstream.MemoryStorage. A
	// memory-backed bucket loses every lock and its token counter when
	// the server restarts.
	Storage jetstream.StorageType
}

// Validate reports the first option out of range as a
// *driver.InvalidOptionError.
func (o *Options) Validate() error {
	_, err := o.resolve()
	return err
}

func (o *Options) resolve() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Bucket == "" {
		r.Bucket = DefaultBucket
	}
	if !validBucket(r.Bucket) {
		return r, &driver.InvalidOptionError{Option: "Bucket", Value: strconv.Quote(r.Bucket), Reason: "must be 1 to 64 of A-Z a-z 0-9 '-' '_'"}
	}
	if r.Replicas == 0 {
		r.Replicas = 1
	}
	if r.Replicas < 1 || r.Replicas > 5 {
		return r, &driver.InvalidOptionError{Option: "Replicas", Value: strconv.Itoa(r.Replicas), Reason: "must be 1 to 5 (JetStream's limit); use 3 for a bucket that survives the loss of a server"}
	}
	if r.Storage != jetstream.FileStorage && r.Storage != jetstream.MemoryStorage {
		return r, &driver.InvalidOptionError{Option: "Storage", Value: fmt.Sprint(int(r.Storage)), Reason: "must be jetstream.FileStorage or jetstream.MemoryStorage"}
	}
	return r, nil
}

func validBucket(b string) bool {
	if len(b) == 0 || len(b) > 64 {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
