// Package resource is the conformance suite for fenced resources: the
// other half of fencing. conformance.Run proves a backend issues tokens
// that strictly increase per key; Run here proves that a resource — a
// PostgreSQL table behind a kit, a Redis script, an HTTP service, your own
// store — applies the fencing rule of docs/fencing.md to every write, in
// one atomic step with the write:
//
//	A write carrying token T from holder H is accepted if T is greater than
//	the highest token the resource has accepted, or if T equals that highest
//	token and H is the holder that presented it. An accepted write records
//	T and H. Anything else is refused, and changes nothing. (Token 0 is
//	never issued, and never accepted.)
//
// Hand Run your resource behind the two-method Resource interface:
//
//	func TestMyResource(t *testing.T) {
//		resource.Run(t, resource.Harness{
//			Resource: func(t *testing.T) resource.Resource { return myResource(t) },
//		})
//	}
//
// Each case is a subtest named by the behaviour it proves (RuleTable,
// ExactTokensPast2to53, Tokens64, ConcurrentWritersInterleaved,
// ConcurrentHoldersOfOneToken, PausedHolderLateWrite, SameHolderRewrite,
// RefusalChangesNothing, NamesAreIndependent). Each reports its first
// violation with the history of writes (and read-backs) that led to it.
//
// Tokens: the suite writes tokens up to 2^63-1, the most any backend
// issues and the largest PostgreSQL bigint, so a resource that stores
// tokens as signed 64-bit integers passes. A resource that takes every
// fencelock.Token (up to 2^64-1) sets Harness.Tokens64 and is held to that
// too.
//
// Reads: Read must see every write accepted before it began (a
// linearizable read of the resource, as a read from the primary is). The
// concurrent cases judge the order of accepted writes by what reads show.
package resource

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock"
)

// Resource is a fenced resource under test.
type Resource interface {
	// Write stores value under name if token and holder pass the fencing
	// rule for name, and records them as name's highest token and its
	// holder, in one atomic step. A refused write returns an error
	// matching fencelock.ErrStaleToken and changes nothing: neither the
	// value nor the recorded token and holder. Other errors (the store
	// failed) are reported by the suite as failures of the resource.
	Write(ctx context.Context, name string, token fencelock.Token, holder, value string) error
	// Read returns the value last accepted for name; ok is false if no
	// write to name was ever accepted.
	Read(ctx context.Context, name string) (value string, ok bool, err error)
}

// Harness is what Run needs.
type Harness struct {
	// Resource returns the resource under test. Every name the suite
	// writes is unique to its run (a random prefix), so one resource may
	// serve every case and every run. Required.
	Resource func(t *testing.T) Resource
	// Writers is how many goroutines write at once in the concurrent
	// cases; 0 means 16.
	Writers int
	// Tokens64 says the resource takes every fencelock.Token, up to
	// 2^64-1, not only those up to 2^63-1: the Tokens64 case then writes
	// tokens past 2^63 (it is skipped otherwise).
	Tokens64 bool
}

// Case is one write of the rule's table and whether the rule accepts it.
// Cases run in order against one name.
type Case struct {
	Token  fencelock.Token
	Holder string
	Accept bool
	Why    string
}

// Cases is docs/fencing.md's table of cases, in order: every part of the
// rule, and tokens past 2^53 (exact only as integers) up to 2^63-1.
var Cases = []Case{
	{0, "a", false, "0 is never a token"},
	{5, "a", true, "higher than anything seen"},
	{5, "a", true, "the same holder writes again"},
	{5, "b", false, "equal token, another holder"},
	{4, "c", false, "lower: a paused holder's late write"},
	{9, "b", true, "the next holder"},
	{10, "b", true, "a rotation; one digit longer, still higher"},
	{9, "b", false, "lower, even from the holder that wrote it"},
	{5, "a", false, "the first holder wakes up"},
	{9007199254740993, "c", true, "2^53+1: not a double"},
	{9007199254740992, "d", false, "2^53: lower by one (the same double as 2^53+1)"},
	{9007199254740993, "d", false, "equal token, another holder"},
	{9007199254740993, "c", true, "equal token, the same holder"},
	{9007199254740994, "d", true, "higher by one"},
	{9223372036854775806, "e", true, "2^63-2"},
	{9223372036854775807, "f", true, "2^63-1, the largest PostgreSQL bigint"},
	{9223372036854775806, "e", false, "lower"},
	{9223372036854775807, "e", false, "equal token, another holder"},
}

// Run runs the resource conformance cases against h's resource. Each case
// is a subtest.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Resource == nil {
		t.Fatal("resource.Harness.Resource is nil")
	}
	s := &suite{h: h, prefix: runPrefix()}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, s) })
	}
}
