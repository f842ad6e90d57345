package resource

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
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

func (s *suite) writers() int {
	if s.h.Writers > 0 {
		return s.h.Writers
	}
	return 16
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

// cases are Run's subtests, in order. Their names are the behaviours they
// prove.
var cases = []testCase{
	{"RuleTable", testRuleTable},
	{"ExactTokensPast2to53", testExactTokens},
	{"Tokens64", testTokens64},
	{"PausedHolderLateWrite", testPausedHolderLateWrite},
	{"SameHolderRewrite", testSameHolderRewrite},
	{"RefusalChangesNothing", testRefusalChangesNothing},
	{"NamesAreIndependent", testNamesAreIndependent},
	{"ConcurrentWritersInterleaved", testConcurrentWritersInterleaved},
	{"ConcurrentHoldersOfOneToken", testConcurrentHoldersOfOneToken},
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
	q := newSeq(t, s)
	name := s.name(t, "table")
	for i, c := range Cases {
		q.write(name, c.Token, c.Holder, fmt.Sprintf("step-%d", i+1), c.Accept, fmt.Sprintf("step %d: %s", i+1, c.Why))
	}
}

// testExactTokens: tokens that are one apart but the same double (2^53
// and 2^53+1; 2^63-2 and 2^63-1) are told apart even when the same holder
// presents them, where a comparison through floating point sees them
// equal and lets the holder's lower token through.
func testExactTokens(t *testing.T, s *suite) {
	q := newSeq(t, s)
	name := s.name(t, "exact")
	const p53 = fencelock.Token(1) << 53
	q.write(name, p53+1, "c", "c-1", true, "2^53+1: higher than anything seen")
	q.write(name, p53, "c", "c-2", false, "2^53, the same holder: lower by one (the same double as 2^53+1)")
	q.write(name, p53+2, "c", "c-3", true, "2^53+2: higher by one")
	q.write(name, 1<<63-1, "d", "d-1", true, "2^63-1: the next holder")
	q.write(name, 1<<63-2, "d", "d-2", false, "2^63-2, the same holder: lower by one (the same double as 2^63-1)")
	q.write(name, 1<<63-1, "d", "d-3", true, "2^63-1, the same holder again")
}

// testTokens64: a resource that takes every fencelock.Token orders tokens
// past 2^63 (negative as int64) above those below it.
func testTokens64(t *testing.T, s *suite) {
	if !s.h.Tokens64 {
		t.Skip("Harness.Tokens64 is false: the resource is held to tokens up to 2^63-1")
	}
	q := newSeq(t, s)
	name := s.name(t, "tokens64")
	q.write(name, 1<<63-1, "a", "a-1", true, "2^63-1: higher than anything seen")
	q.write(name, 1<<63, "b", "b-1", true, "2^63: higher by one (negative as an int64)")
	q.write(name, 1<<63-1, "a", "a-2", false, "2^63-1: lower")
	q.write(name, 1<<64-2, "c", "c-1", true, "2^64-2: higher")
	q.write(name, 1<<64-1, "d", "d-1", true, "2^64-1, the largest token")
	q.write(name, 1<<64-2, "c", "c-2", false, "2^64-2: lower")
	q.write(name, 1<<64-1, "e", "e-1", false, "2^64-1: equal token, another holder")
	q.write(name, 1<<64-1, "d", "d-2", true, "2^64-1: equal token, the same holder")
}

// testPausedHolderLateWrite: holder A writes with token t, the next holder
// B with t+1, then A, paused meanwhile, writes again: refused, and the
// value stays B's; B goes on writing.
func testPausedHolderLateWrite(t *testing.T, s *suite) {
	q := newSeq(t, s)
	name := s.name(t, "paused")
	q.write(name, 41, "A", "a-1", true, "A holds the lock with token 41")
	q.write(name, 42, "B", "b-1", true, "A's lease ran out while A was paused; B holds token 42")
	q.write(name, 41, "A", "a-late", false, "A wakes up and writes late with token 41")
	q.write(name, 42, "B", "b-2", true, "B writes again: its record is intact")
	q.write(name, 41, "A", "a-later", false, "A tries again")
}

// testSameHolderRewrite: a live holder writes again and again with its
// token: every write accepted, each replacing the value.
func testSameHolderRewrite(t *testing.T, s *suite) {
	q := newSeq(t, s)
	name := s.name(t, "rewrite")
	for i := 1; i <= 3; i++ {
		q.write(name, 7, "A", fmt.Sprintf("a-%d", i), true, "the same holder writes again with its token")
	}
	q.write(name, 8, "A", "a-4", true, "the holder's token rotated up")
	q.write(name, 7, "A", "a-5", false, "the holder's token before the rotation: lower")
	q.write(name, 8, "A", "a-6", true, "the holder writes again with its rotated token")
}

// testRefusalChangesNothing: a refused write leaves the value and the
// recorded token and holder as they were. After an equal token from
// another holder is refused, the recorded holder still writes with its
// token and the refused one is still refused; after token 0 is refused on
// a fresh name, the name is still unwritten and token 1 is accepted.
func testRefusalChangesNothing(t *testing.T, s *suite) {
	q := newSeq(t, s)
	name := s.name(t, "refusal")
	q.write(name, 20, "A", "a-1", true, "A writes with token 20")
	q.write(name, 20, "B", "b-1", false, "equal token, another holder")
	q.write(name, 19, "C", "c-1", false, "lower token")
	q.write(name, 20, "B", "b-2", false, "B again: its refused write did not record B")
	q.write(name, 20, "A", "a-2", true, "A again: the refusals did not unseat A's record")
	fresh := s.name(t, "fresh")
	q.write(fresh, 0, "A", "zero", false, "0 is never a token")
	q.write(fresh, 1, "B", "b-1", true, "token 1: the refused 0 recorded nothing")
}

// testNamesAreIndependent: a token accepted for one name does not bear on
// another.
func testNamesAreIndependent(t *testing.T, s *suite) {
	q := newSeq(t, s)
	one, two, three := s.name(t, "one"), s.name(t, "two"), s.name(t, "three")
	q.write(one, 1000, "A", "a-1", true, "A writes one with token 1000")
	q.write(two, 1, "B", "b-1", true, "B writes two with token 1: one's token 1000 is not two's")
	q.write(two, 1, "C", "c-1", false, "equal token on two, another holder")
	q.write(one, 1000, "A", "a-2", true, "A writes one again: two's record is not one's")
	q.write(one, 999, "B", "b-2", false, "lower on one")
	q.write(two, 2, "D", "d-1", true, "higher on two: one's refusals are not two's")
	q.checkUnwritten(three, "a name never written")
}

// seq runs writes in order, reading back after each, and fails with the
// history at the first violation.
type seq struct {
	t    *testing.T
	ctx  context.Context
	r    Resource
	hist history
	want map[string]string // each name's last accepted value
}

func newSeq(t *testing.T, s *suite) *seq {
	return &seq{t: t, ctx: ctxFor(t), r: s.h.Resource(t), want: map[string]string{}}
}

func (q *seq) write(name string, token fencelock.Token, holder, value string, accept bool, why string) {
	q.t.Helper()
	err := q.r.Write(q.ctx, name, token, holder, value)
	outcome := "accepted"
	if err != nil {
		outcome = "refused: " + err.Error()
	}
	q.hist.add("write %q to %s with token %d from %q: %s", value, name, token, holder, outcome)
	rule := "refuses"
	if accept {
		rule = "accepts"
	}
	switch {
	case accept && err != nil:
		q.t.Fatalf("%s: the rule accepts token %d from %q; the resource refused it: %v\nhistory:\n%s", why, token, holder, err, q.hist)
	case !accept && err == nil:
		q.t.Fatalf("%s: the rule %s token %d from %q; the resource accepted it\nhistory:\n%s", why, rule, token, holder, q.hist)
	case !accept && !errors.Is(err, fencelock.ErrStaleToken):
		q.t.Fatalf("%s: refused with %v; want an error matching fencelock.ErrStaleToken\nhistory:\n%s", why, err, q.hist)
	}
	if accept {
		q.want[name] = value
	}
	want, wantOK := q.want[name]
	got, ok, err := q.r.Read(q.ctx, name)
	if err != nil {
		q.t.Fatalf("%s: Read(%s): %v\nhistory:\n%s", why, name, err, q.hist)
	}
	q.hist.add("read %s: %s", name, shown(got, ok))
	if ok != wantOK || got != want {
		what := "an accepted write must replace the value"
		if !accept {
			what = "a refused write must change nothing"
		}
		q.t.Fatalf("%s: Read(%s) = %s; want %s: %s\nhistory:\n%s", why, name, shown(got, ok), shown(want, wantOK), what, q.hist)
	}
}

func (q *seq) checkUnwritten(name, why string) {
	q.t.Helper()
	got, ok, err := q.r.Read(q.ctx, name)
	if err != nil {
		q.t.Fatalf("%s: Read(%s): %v\nhistory:\n%s", why, name, err, q.hist)
	}
	if ok {
		q.t.Fatalf("%s: Read(%s) = %s; want no value: nothing was written to it\nhistory:\n%s", why, name, shown(got, ok), q.hist)
	}
}

func shown(v string, ok bool) string {
	if !ok {
		return "(no value)"
	}
	return fmt.Sprintf("%q", v)
}

// writesPerWriter is how many writes each goroutine of a concurrent case
// makes.
const writesPerWriter = 8

// log is the history of a concurrent case, in the order its events
// completed, and its first violation.
type log struct {
	mu        sync.Mutex
	events    history
	violation string
	at        int // len(events) when the violation was found
}

func (l *log) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events.add(format, args...)
}

// violate records v if it is the first violation.
func (l *log) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.violation == "" {
		l.violation, l.at = fmt.Sprintf(format, args...), len(l.events)
	}
}

func (l *log) failed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.violation != ""
}

func (l *log) report(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.violation != "" {
		t.Fatalf("%s\nhistory (events in the order they completed, up to the violation):\n%s", l.violation, l.events[:l.at])
	}
}

// testConcurrentWritersInterleaved: Writers holders, each with its own
// token (distinct tokens straddling 2^53, dealt in random order), write
// writesPerWriter times each, all at once, each reading back after every
// write. Reads judge the order in which writes were accepted: once a write
// of token t was accepted, or refused (so something above t was accepted:
// tokens are distinct), every read that begins afterwards, by anyone, must
// show a value of token at least t (above t after a refusal); and no read
// may show a lower token than a read that completed before it began. A
// holder refused once is refused ever after; the holder of the highest
// token is never refused, and the value at the end is its last write. A
// resource whose check and write are not one atomic step lets a lower
// token's write land after a higher one's, and a later read shows it.
//
// Whether writers interleave at the check is up to the scheduler, so the
// case runs concurrentRounds rounds, each on a fresh name, and stops at the
// first violation.
func testConcurrentWritersInterleaved(t *testing.T, s *suite) {
	ctx := ctxFor(t)
	r := s.h.Resource(t)
	for round := range concurrentRounds {
		interleavedRound(ctx, t, s, r, s.name(t, fmt.Sprintf("interleaved.%d", round)))
	}
}

// concurrentRounds is how many times each concurrent case runs.
const concurrentRounds = 8

func interleavedRound(ctx context.Context, t *testing.T, s *suite, r Resource, name string) {
	n := s.writers()
	base := fencelock.Token(1)<<53 - fencelock.Token(n/2)
	perm := mrand.Perm(n)
	tokenOf := map[string]fencelock.Token{} // every value written, and its token
	type writer struct {
		holder string
		token  fencelock.Token
		values []string
	}
	ws := make([]writer, n)
	top := 0
	for i := range ws {
		w := writer{holder: fmt.Sprintf("w%d", i), token: base + fencelock.Token(perm[i])}
		for j := range writesPerWriter {
			v := fmt.Sprintf("%s-%d(token %d)", w.holder, j+1, w.token)
			w.values = append(w.values, v)
			tokenOf[v] = w.token
		}
		ws[i] = w
		if w.token > ws[top].token {
			top = i
		}
	}
	var (
		l     log
		floor sync.Mutex
		least fencelock.Token // the least token any read that begins now must show
	)
	raise := func(t fencelock.Token) {
		floor.Lock()
		least = max(least, t)
		floor.Unlock()
	}
	lowest := func() fencelock.Token {
		floor.Lock()
		defer floor.Unlock()
		return least
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, i := range mrand.Perm(n) {
		w := ws[i]
		wg.Go(func() {
			<-start
			refused := false
			for _, v := range w.values {
				if l.failed() || ctx.Err() != nil {
					return
				}
				err := r.Write(ctx, name, w.token, w.holder, v)
				switch {
				case err == nil:
					l.add("%s: write %q with token %d: accepted", w.holder, v, w.token)
					if refused {
						l.violate("%s's write %q with token %d was accepted after one of its writes was refused: the highest token went down", w.holder, v, w.token)
					}
					raise(w.token)
				case errors.Is(err, fencelock.ErrStaleToken):
					l.add("%s: write %q with token %d: refused: %v", w.holder, v, w.token, err)
					refused = true
					if i == top {
						l.violate("%s holds the highest token, %d, and its write %q was refused: %v", w.holder, w.token, v, err)
					}
					raise(w.token + 1)
				default:
					l.violate("%s: Write %q with token %d: %v", w.holder, v, w.token, err)
					return
				}
				least := lowest()
				got, ok, err := r.Read(ctx, name)
				if err != nil {
					l.violate("%s: Read: %v", w.holder, err)
					return
				}
				l.add("%s: read %s", w.holder, shown(got, ok))
				tok, known := tokenOf[got]
				switch {
				case !ok:
					l.violate("%s: Read after writes were accepted shows no value", w.holder)
				case !known:
					l.violate("%s: Read shows %q, which no writer wrote", w.holder, got)
				case tok < least:
					l.violate("%s: Read shows %q, of token %d; a write of token %d or above had already been accepted (or a read had shown it): accepted writes' tokens went down", w.holder, got, tok, least)
				default:
					raise(tok)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	l.report(t)
	got, ok, err := r.Read(ctx, name)
	if err != nil {
		t.Fatalf("Read at the end: %v", err)
	}
	if want := ws[top].values[writesPerWriter-1]; !ok || got != want {
		l.violate("Read at the end = %s; want %q, the last write of the holder of the highest token", shown(got, ok), want)
		l.report(t)
	}
}

// testConcurrentHoldersOfOneToken: Writers holders present the same token
// at once, writesPerWriter times each, reading back after every write. The
// rule lets exactly one holder in (the first), and only it ever after:
// every read shows its value, and the value at the end is its last write.
// A resource that drops the holder check, or whose check and write are not
// one atomic step, lets a second holder in. Like the interleaved case, it
// runs concurrentRounds rounds.
func testConcurrentHoldersOfOneToken(t *testing.T, s *suite) {
	ctx := ctxFor(t)
	r := s.h.Resource(t)
	for round := range concurrentRounds {
		oneTokenRound(ctx, t, s, r, s.name(t, fmt.Sprintf("onetoken.%d", round)))
	}
}

func oneTokenRound(ctx context.Context, t *testing.T, s *suite, r Resource, name string) {
	n := s.writers()
	const token = fencelock.Token(1)<<62 + 12345
	holderOf := map[string]string{}
	values := make([][]string, n)
	for i := range n {
		h := fmt.Sprintf("h%d", i)
		for j := range writesPerWriter {
			v := fmt.Sprintf("%s-%d", h, j+1)
			values[i] = append(values[i], v)
			holderOf[v] = h
		}
	}
	var (
		l        log
		mu       sync.Mutex
		winner   string
		accepted = map[string]bool{}
	)
	admit := func(h string) {
		mu.Lock()
		defer mu.Unlock()
		accepted[h] = true
		if winner == "" {
			winner = h
		} else if winner != h {
			l.violate("%s and %s both had writes with token %d accepted: one token, two holders", winner, h, token)
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		holder := fmt.Sprintf("h%d", i)
		wg.Go(func() {
			<-start
			for j, v := range values[i] {
				if l.failed() || ctx.Err() != nil {
					return
				}
				err := r.Write(ctx, name, token, holder, v)
				switch {
				case err == nil:
					l.add("%s: write %q with token %d: accepted", holder, v, token)
					admit(holder)
				case errors.Is(err, fencelock.ErrStaleToken):
					l.add("%s: write %q with token %d: refused: %v", holder, v, token, err)
					mu.Lock()
					in := accepted[holder]
					mu.Unlock()
					if in {
						l.violate("%s's write %q was refused after its write %d was accepted with the same token", holder, v, j)
					}
				default:
					l.violate("%s: Write %q: %v", holder, v, err)
					return
				}
				got, ok, err := r.Read(ctx, name)
				if err != nil {
					l.violate("%s: Read: %v", holder, err)
					return
				}
				l.add("%s: read %s", holder, shown(got, ok))
				switch h := holderOf[got]; {
				case !ok:
					l.violate("%s: Read after its write shows no value", holder)
				case h == "":
					l.violate("%s: Read shows %q, which no holder wrote", holder, got)
				default:
					admit(h) // the value shows h was admitted, whether or not h's Write has returned
				}
			}
		})
	}
	close(start)
	wg.Wait()
	l.report(t)
	got, ok, err := r.Read(ctx, name)
	if err != nil {
		t.Fatalf("Read at the end: %v", err)
	}
	if winner == "" {
		t.Fatalf("no holder's write with token %d was accepted\nhistory:\n%s", token, l.events)
	}
	var last string
	for i := range n {
		if fmt.Sprintf("h%d", i) == winner {
			last = values[i][writesPerWriter-1]
		}
	}
	if !ok || got != last {
		l.violate("Read at the end = %s; want %q, the last write of %s, the one holder admitted", shown(got, ok), last, winner)
		l.report(t)
	}
}
