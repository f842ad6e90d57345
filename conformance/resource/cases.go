package resource

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
)

// suite is one Run.
type suite struct {
	h      Harness
	prefix string
}

// name returns a resource name unique to this run and case.
func (s *suite) name(t *testing.T, suffix string) string {
	return s.prefix + strings.ReplaceAll(t.Name(), "/", ".") + "." + suffix
}

func runPrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "fencelock-resource-" + hex.EncodeToString(b[:]) + "."
}

// history is the writes of a case so far, for the report of a violation.
type history []string

func (h *history) add(format string, args ...any) { *h = append(*h, fmt.Sprintf(format, args...)) }

func (h history) String() string {
	if len(h) == 0 {
		return "  (no writes)"
	}
	return "  " + strings.Join(h, "\n  ")
}

type testCase struct {
	name string
	run  func(t *testing.T, s *suite)
}

var cases = []testCase{
	{"RuleTable", testRuleTable},
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// testRuleTable writes Cases in order to one name: each write must be
// accepted or refused as the rule says, a refused write must match
// ErrStaleToken, and a read after each write must show the value of the
// last accepted one.
func testRuleTable(t *testing.T, s *suite) {
	ctx := ctxFor(t)
	r := s.h.Resource(t)
	name := s.name(t, "table")
	var hist history
	last, any := "", false
	for i, c := range Cases {
		value := fmt.Sprintf("step-%d", i+1)
		err := r.Write(ctx, name, c.Token, c.Holder, value)
		outcome := "accepted"
		if err != nil {
			outcome = "refused: " + err.Error()
		}
		hist.add("step %d: write %q with token %d from %q: %s", i+1, value, c.Token, c.Holder, outcome)
		switch {
		case c.Accept && err != nil:
			t.Fatalf("step %d (%s): the rule accepts token %d from %q; the resource refused it: %v\nhistory:\n%s", i+1, c.Why, c.Token, c.Holder, err, hist)
		case !c.Accept && err == nil:
			t.Fatalf("step %d (%s): the rule refuses token %d from %q; the resource accepted it\nhistory:\n%s", i+1, c.Why, c.Token, c.Holder, hist)
		case !c.Accept && !errors.Is(err, fencelock.ErrStaleToken):
			t.Fatalf("step %d (%s): refused with %v; want an error matching fencelock.ErrStaleToken\nhistory:\n%s", i+1, c.Why, err, hist)
		}
		if c.Accept {
			last, any = value, true
		}
		got, ok, err := r.Read(ctx, name)
		if err != nil {
			t.Fatalf("step %d: Read: %v\nhistory:\n%s", i+1, err, hist)
		}
		if ok != any || got != last {
			t.Fatalf("step %d (%s): Read = %q (ok %v); want %q (ok %v): a refused write must change nothing\nhistory:\n%s", i+1, c.Why, got, ok, last, any, hist)
		}
	}
}
