// Package etcdfence applies fencelock's fencing rule inside etcd, in the
// same transaction as your own puts and deletes, so that a paused holder's
// late write can never land after the next holder's.
//
// The rule, from docs/fencing.md
// (https://github.com/fencelock/fencelock/blob/main/docs/fencing.md):
// a write carrying token T from holder H is accepted if T is greater than
// the highest token the resource has accepted, or if T equals that highest
// token and H is the holder that presented it; an accepted write records T
// and H; anything else is refused and changes nothing. Token 0 is never
// accepted.
//
// For the common case, Txn runs your operations in one etcd transaction
// guarded by the rule and records the token: a refused token returns a
// *fencelock.StaleTokenError, which matches fencelock.ErrStaleToken, and
// nothing is written. To fence a transaction of your own, add Cmps to its
// If and Record to its Then; Read in its Else and Judge tell a refusal by
// the fence from one by your own compares.
//
// # The record
//
// A resource's fence is one key, under a directory of its own:
//
//	<prefix><resource, path-escaped>/<token: 20 decimal digits>/<holder>
//
// The token is zero-padded to 20 digits (2^64-1 has 20), so etcd's
// byte-wise order of keys is the numeric order of tokens, for every
// fencelock.Token: no token ever passes through a floating-point number.
// The resource name is escaped with url.PathEscape, so no name's directory
// holds another's. The key's value is empty. Because the token and the
// holder are in the key, the whole rule is two range compares that must
// both hold, with no OR: the directory has no key above
// "<token>/<holder>", and none from "<token>/" below "<token>/<holder>"
// (another holder of the same token). An accepted write deletes the lower
// tokens' keys and puts its own, so the directory holds one key. A
// missing directory is a resource that has seen no token.
//
// The zero Fences, and the package-level functions, keep fences under
// DefaultPrefix; set Fences.Prefix to use another. Keep your own keys out
// of the prefix.
package etcdfence

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock"
)

// DefaultPrefix is the key prefix of the zero Fences and of the
// package-level functions.
const DefaultPrefix = "fencelock-fences/"

// tokenDigits is the width of an encoded token: 2^64-1 has 20 digits.
const tokenDigits = 20

// Fences is a set of fences, kept under a key prefix. Its zero value uses
// DefaultPrefix.
type Fences struct {
	// Prefix is the key prefix under which fences are kept. Empty means
	// DefaultPrefix.
	Prefix string
}

// dir returns the directory of resource's fence: every key of the fence
// is under it, and no key of any other resource is.
func (f Fences) dir(resource string) string {
	p := f.Prefix
	if p == "" {
		p = DefaultPrefix
	}
	return p + url.PathEscape(resource) + "/"
}

// EncodeToken returns token as etcd fences store it: 20 decimal digits,
// zero-padded, so that byte-wise order is numeric order.
func EncodeToken(token fencelock.Token) string {
	return fmt.Sprintf("%0*d", tokenDigits, uint64(token))
}

// Key returns the fence key that an accepted write of token by holder
// records for resource.
func (f Fences) Key(resource string, token fencelock.Token, holder string) string {
	return f.dir(resource) + EncodeToken(token) + "/" + holder
}

// Cmps returns the compares that hold if and only if the fencing rule
// accepts token from holder for resource. Add them to the If of your own
// transaction, with Record in its Then. For token 0 they never hold.
func (f Fences) Cmps(resource string, token fencelock.Token, holder string) []clientv3.Cmp {
	dir := f.dir(resource)
	if token == 0 {
		// A create revision is never negative: this never holds.
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(dir), "<", 0)}
	}
	same := dir + EncodeToken(token) + "/"
	key := same + holder
	return []clientv3.Cmp{
		// No key above ours: no higher token, and no other holder of
		// ours whose name sorts above ours.
		clientv3.Compare(clientv3.CreateRevision(key+"\x00"), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(dir)),
		// No other holder of our token whose name sorts below ours.
		clientv3.Compare(clientv3.CreateRevision(same), "=", 0).WithRange(key),
	}
}

// Record returns the operations that record token and holder as
// resource's highest: a delete of the lower tokens' keys and a put of the
// fence key. Add them to the Then of a transaction whose If has Cmps for
// the same arguments; without Cmps they would record a refused token.
func (f Fences) Record(resource string, token fencelock.Token, holder string) []clientv3.Op {
	dir := f.dir(resource)
	return []clientv3.Op{
		clientv3.OpDelete(dir, clientv3.WithRange(dir+EncodeToken(token)+"/")),
		clientv3.OpPut(f.Key(resource, token, holder), ""),
	}
}

// Read returns a get of resource's fence, for the Else of your own
// transaction: pass what it returns (the response's Kvs) to Judge.
func (f Fences) Read(resource string) clientv3.Op {
	return clientv3.OpGet(f.dir(resource), readOptions()...)
}

// Judge applies the fencing rule to resource's fence as Read got it
// (kvs), as etcd applied Cmps in the same transaction: it returns nil if
// the rule accepts token from holder (so your own compares failed), and a
// *fencelock.StaleTokenError if it refuses it.
func (f Fences) Judge(resource string, token fencelock.Token, holder string, kvs []*mvccpb.KeyValue) error {
	high, who, err := f.highest(resource, kvs)
	if err != nil {
		return err
	}
	if token != 0 && (token > high || (token == high && holder == who)) {
		return nil
	}
	return &fencelock.StaleTokenError{Resource: resource, Token: token, Highest: high}
}

// highest decodes the highest token and its holder from what Read got.
func (f Fences) highest(resource string, kvs []*mvccpb.KeyValue) (fencelock.Token, string, error) {
	if len(kvs) == 0 {
		return 0, "", nil
	}
	dir := f.dir(resource)
	rest, ok := strings.CutPrefix(string(kvs[0].Key), dir)
	if !ok || len(rest) < tokenDigits+1 || rest[tokenDigits] != '/' {
		return 0, "", fmt.Errorf("etcdfence: key %q under the fence of %q is not a fence record: keep other keys out of the fence prefix", kvs[0].Key, resource)
	}
	n, err := strconv.ParseUint(rest[:tokenDigits], 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("etcdfence: key %q under the fence of %q is not a fence record: keep other keys out of the fence prefix", kvs[0].Key, resource)
	}
	return fencelock.Token(n), rest[tokenDigits+1:], nil
}

// Highest returns the highest token resource's fence has accepted and
// its holder (0 and "" if none).
func (f Fences) Highest(ctx context.Context, kv clientv3.KV, resource string) (fencelock.Token, string, error) {
	resp, err := kv.Get(ctx, f.dir(resource), readOptions()...)
	if err != nil {
		return 0, "", fmt.Errorf("etcdfence: read the fence of %q: %w", resource, err)
	}
	return f.highest(resource, resp.Kvs)
}

// readOptions get the highest key of a fence's directory.
func readOptions() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1)}
}

// Txn runs ops (puts, deletes, gets, nested transactions) in one etcd
// transaction if the fencing rule accepts token from holder for resource,
// and records them. It returns the transaction's response: the responses
// to ops come first, in order, then those to Record's two operations. A
// refused token returns a *fencelock.StaleTokenError (matching
// fencelock.ErrStaleToken) with the highest token accepted, and nothing
// is written. ops must not touch keys under the fence prefix.
func (f Fences) Txn(ctx context.Context, kv clientv3.KV, resource string, token fencelock.Token, holder string, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	then := append(append([]clientv3.Op(nil), ops...), f.Record(resource, token, holder)...)
	resp, err := kv.Txn(ctx).If(f.Cmps(resource, token, holder)...).Then(then...).Else(f.Read(resource)).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcdfence: fenced transaction on %q: %w", resource, err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	var kvs []*mvccpb.KeyValue
	if len(resp.Responses) > 0 {
		if r := resp.Responses[0].GetResponseRange(); r != nil {
			kvs = r.Kvs
		}
	}
	if err := f.Judge(resource, token, holder, kvs); err != nil {
		return nil, err
	}
	// Cmps failed but the fence read in the same revision accepts: this
	// cannot happen unless a key under the prefix is not a fence record.
	return nil, fmt.Errorf("etcdfence: the fence of %q refused token %d yet reads as accepting it: keep other keys out of the fence prefix %q", resource, token, f.dir(resource))
}

// Cmps is Fences{}.Cmps: the compares of the rule under DefaultPrefix.
func Cmps(resource string, token fencelock.Token, holder string) []clientv3.Cmp {
	return Fences{}.Cmps(resource, token, holder)
}

// Record is Fences{}.Record: the record of an accepted token under
// DefaultPrefix.
func Record(resource string, token fencelock.Token, holder string) []clientv3.Op {
	return Fences{}.Record(resource, token, holder)
}

// Read is Fences{}.Read: a get of resource's fence under DefaultPrefix.
func Read(resource string) clientv3.Op { return Fences{}.Read(resource) }

// Judge is Fences{}.Judge: the rule applied to what Read got.
func Judge(resource string, token fencelock.Token, holder string, kvs []*mvccpb.KeyValue) error {
	return Fences{}.Judge(resource, token, holder, kvs)
}

// Highest is Fences{}.Highest: resource's highest token and its holder
// under DefaultPrefix.
func Highest(ctx context.Context, kv clientv3.KV, resource string) (fencelock.Token, string, error) {
	return Fences{}.Highest(ctx, kv, resource)
}

// Txn is Fences{}.Txn: ops in one transaction fenced under DefaultPrefix.
func Txn(ctx context.Context, kv clientv3.KV, resource string, token fencelock.Token, holder string, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	return Fences{}.Txn(ctx, kv, resource, token, holder, ops...)
}
