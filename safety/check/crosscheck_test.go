package check

// The generative mode (conformance/generative) and this package check
// the same lock invariants on two kinds of history: the generative
// mode's, in one total order of instants, with no slack, windows cut by
// forced releases and closes; this package's, in a shared monotonic
// clock, with a measurement slack, beliefs cut by Until, crashes and
// pauses. Neither can be written in the other's terms without losing
// what it checks, so both are kept; the tests here feed both the same
// histories and check that they agree on every invariant they share:
//
//	exclusion    generative NoTwoHolders                          ↔ P3, P4
//	tokens       generative TokensIncreaseAcrossHolders,
//	             TokensNonZero                                    ↔ P2
//	stale-write  generative NoStaleWriteAccepted                  ↔ P1 (its
//	             rule across leases: Stats.StaleAccepted)
//
// Slack is set to 1ns here: the generative checker has none.
// The other properties have no counterpart on the other side (P5, P6, P8
// are liveness; P7 and NoLossWithoutCause judge losses by different
// causes; the generative options' properties need what the safety
// history does not record) and are not compared. P1's rule within a
// lease (a pre-rotation token refused once its rotated one was
// accepted) has no generative counterpart.
//
// Read-write locks (crosscheck_rw_test.go), a grant being a lease on its
// lock's gate (a writer) or on a reader slot (recipe.Keys):
//
//	rw-exclusion     generative NoTwoWriters, NoReaderBesideWriter  ↔ W1
//	rw-tokens        generative GrantTokensIncrease                 ↔ W2
//	rw-stale-access  generative NoStaleAccessAccepted               ↔ W3
//
// Semaphores: a permit is a lease on a slot key, judged by both sides'
// lock invariants per slot; S1 (at most N slots believed) and S2 (a
// stopped holder's permit comes back) have no generative counterpart,
// and elections have a checker on one side only.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/safety/fence"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/mono"
	"pgregory.net/rapid"
)

// crossConfig is the configuration both checkers are compared under.
var crossConfig = Config{TTL: time.Second, Poll: 100 * time.Millisecond, Slack: time.Nanosecond, RW: true}

// sharedOf maps each property either checker reports to the shared
// invariant it checks; properties not listed have no counterpart.
var sharedOf = map[string]string{
	"P1":                          "stale-write",
	"P2":                          "tokens",
	"P3":                          "exclusion",
	"P4":                          "exclusion",
	"NoStaleWriteAccepted":        "stale-write",
	"TokensIncreaseAcrossHolders": "tokens",
	"TokensNonZero":               "tokens",
	"NoTwoHolders":                "exclusion",
	"W1":                          "rw-exclusion",
	"W2":                          "rw-tokens",
	"W3":                          "rw-stale-access",
	"NoTwoWriters":                "rw-exclusion",
	"NoReaderBesideWriter":        "rw-exclusion",
	"GrantTokensIncrease":         "rw-tokens",
	"NoStaleAccessAccepted":       "rw-stale-access",
}

// replayOf writes h in the generative checker's terms: a lease's window runs
// from its Acquired to the earliest of its Lost, its ReleaseStart, the
// first Crash of its process after it was acquired and the largest Until
// it reported (the belief interval of the package doc); a write is the
// fence's Write, invoked and answered at its T. A read-write lock's
// grants are leases on its gate and reader slot keys, as in h; an access
// to its resource (a Write with Access set) is a write by its grant's
// lease, which the Replay judges as an access.
func replayOf(t fataler, h history.History) generative.Replay {
	t.Helper()
	h = append(history.History(nil), h...)
	h.Sort()
	var rp generative.Replay
	idx := map[string]int{}         // lease id → index in rp.Leases
	until := map[string]int64{}     // lease id → largest Until
	started := map[string]int64{}   // proc → last AcquireStart
	clients := map[string]int{}     // proc → client number
	crashes := map[string][]int64{} // proc → its crashes
	end := func(i int, at int64) {
		if l := &rp.Leases[i]; l.End == 0 || at < l.End {
			l.End = at
		}
	}
	for _, e := range h {
		if _, ok := clients[e.Proc]; !ok {
			clients[e.Proc] = len(clients)
		}
		i, known := idx[e.Lease]
		switch e.Kind {
		case history.AcquireStart:
			started[e.Proc] = e.T
		case history.Acquired:
			if e.Lease == "" || known {
				continue
			}
			inv, ok := started[e.Proc]
			if !ok {
				inv = e.T
			}
			idx[e.Lease] = len(rp.Leases)
			rp.Leases = append(rp.Leases, generative.ReplayLease{
				Client: clients[e.Proc], Key: e.Key, Owner: e.Lease, Inv: inv, Got: e.T,
				Tokens: []generative.ReplayToken{{Token: fencelock.Token(e.Token), At: e.T}},
			})
			until[e.Lease] = e.Until
		case history.Belief:
			if !known {
				continue
			}
			until[e.Lease] = max(until[e.Lease], e.Until)
			l := &rp.Leases[i]
			if tok := fencelock.Token(e.Token); tok != 0 && !slices.ContainsFunc(l.Tokens, func(x generative.ReplayToken) bool { return x.Token == tok }) {
				l.Tokens = append(l.Tokens, generative.ReplayToken{Token: tok, At: e.T})
			}
		case history.Lost, history.ReleaseStart:
			if known {
				end(i, e.T)
			}
		case history.Crash:
			crashes[e.Proc] = append(crashes[e.Proc], e.T)
		}
	}
	for id, i := range idx {
		l := &rp.Leases[i]
		if u := until[id]; u != 0 {
			end(i, u)
		}
		for p, c := range clients {
			if c != l.Client {
				continue
			}
			for _, at := range crashes[p] {
				if at >= l.Got {
					end(i, at)
					break
				}
			}
		}
	}
	for _, e := range h {
		i, known := idx[e.Lease]
		if e.Kind != history.Write || !known {
			continue // a write by a lease never acquired: the generative history has none
		}
		l := rp.Leases[i]
		if lock, _ := rwOf(l.Key); (e.Access != "") != (lock != "") {
			continue // a plain write by a grant, or an access by a plain lease: neither checker judges it
		}
		rp.Writes = append(rp.Writes, generative.ReplayWrite{
			Lease: i, Token: fencelock.Token(e.Token), Invoked: e.T, Returned: e.T, Accepted: e.Accepted,
			Late: l.End != 0 && e.T >= l.End,
		})
	}
	return rp
}

// fataler is what judge needs of a *testing.T or a *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// verdicts is what each checker said about one history, by shared
// invariant: the properties that found it broken, and an example.
type verdicts struct {
	safety, generative map[string][]string
}

func (v verdicts) String() string {
	var b strings.Builder
	for _, side := range []struct {
		name string
		m    map[string][]string
	}{{"safety", v.safety}, {"generative", v.generative}} {
		fmt.Fprintf(&b, "  %s:", side.name)
		if len(side.m) == 0 {
			b.WriteString(" keeps every shared invariant")
		}
		b.WriteString("\n")
		for _, k := range slices.Sorted(maps.Keys(side.m)) {
			fmt.Fprintf(&b, "    %s: %s\n", k, strings.Join(side.m[k], "; "))
		}
	}
	return b.String()
}

// agree reports whether both checkers found the same shared invariants
// broken (possibly none). Where both found two leases of a key, or two
// grants of a read-write lock, believing at once, only the exclusion
// invariants are compared: which of the two is the older is then not
// defined, and each checker orders them its own way for tokens and
// stale writes (this package by Acquired time, the generative checker
// not at all: it skips pairs whose order it cannot tell). Where both
// found a read-write grant's token out of order, rw-stale-access is not
// compared: W3 orders grants by acquisition, NoStaleAccessAccepted by
// token, and the two orders then differ.
func (v verdicts) agree() bool {
	both := func(inv string) bool { return v.safety[inv] != nil && v.generative[inv] != nil }
	keys := func(m map[string][]string) []string {
		var ks []string
		for k := range m {
			switch {
			case both("exclusion") || both("rw-exclusion"):
				if k != "exclusion" && k != "rw-exclusion" {
					continue
				}
			case both("rw-tokens"):
				if k == "rw-stale-access" {
					continue
				}
			}
			ks = append(ks, k)
		}
		return slices.Sorted(slices.Values(ks))
	}
	return slices.Equal(keys(v.safety), keys(v.generative))
}

// judge feeds h to both checkers and returns their verdicts on the
// shared invariants.
func judge(t fataler, h history.History) verdicts {
	t.Helper()
	v := verdicts{safety: map[string][]string{}, generative: map[string][]string{}}
	r := Check(h, crossConfig)
	for _, p := range r.Properties {
		if p.ID == "P1" && r.Stats.StaleAccepted == 0 {
			// Only P1's other rule broke: a lease's pre-rotation token
			// accepted after its rotated one, which the generative
			// checker does not judge.
			continue
		}
		if inv, ok := sharedOf[p.ID]; ok && !p.OK {
			msg := p.ID
			if len(p.Violations) > 0 {
				msg += " " + p.Violations[0].Msg
			}
			v.safety[inv] = append(v.safety[inv], msg)
		}
	}
	vs, err := replayOf(t, h).Check()
	if err != nil {
		t.Fatalf("generative checker: %v", err)
	}
	for _, x := range vs {
		if inv, ok := sharedOf[x.Property]; ok {
			v.generative[inv] = append(v.generative[inv], x.String())
		}
	}
	return v
}

// mustAgree fails t unless both checkers agree on h, and returns the
// shared invariants they found broken.
func mustAgree(t testing.TB, name string, h history.History) []string {
	t.Helper()
	v := judge(t, h)
	if !v.agree() {
		t.Errorf("%s: the checkers disagree\n%s  history:\n%s", name, v, formatHistory(h))
	}
	return slices.Sorted(maps.Keys(v.safety))
}

func formatHistory(h history.History) string {
	h = append(history.History(nil), h...)
	h.Sort()
	var b strings.Builder
	for _, e := range h {
		b.WriteString("    " + FormatEvent(e) + "\n")
	}
	return b.String()
}

// TestCheckersAgreeOnNegativeControls feeds both checkers the base
// scenario of TestNegativeControls and every one of its mutants (each
// breaks one property) and checks that they agree on every shared
// invariant: a mutant of a shared invariant is caught by both, one of a
// property the other side lacks by neither.
func TestCheckersAgreeOnNegativeControls(t *testing.T) {
	for _, tc := range []struct {
		name string
		k    knobs
		want []string // the shared invariants both must find broken
	}{
		{"base", knobs{}, nil},
		{"P1 fencing off", knobs{fencingOff: true}, []string{"stale-write"}},
		{"P2 token issued twice", knobs{c3Token: 20}, []string{"tokens"}},
		{"P2 token goes backwards", knobs{c3Token: 15}, []string{"tokens"}},
		{"P3 acquire before release", knobs{c2AcquiredAt: 50}, []string{"exclusion"}},
		{"P4 belief past the next acquisition", knobs{c2Until: 1300}, []string{"exclusion"}},
		{"P5 crashed holder's key stranded", knobs{c1ReacquireAt: 3100}, nil},
		{"P6 no progress after a fault", knobs{stuckTail: true}, nil},
		{"P7 stale release ends the holder's lease", knobs{staleOpLoss: true}, nil},
		{"P7 third lease after a stale release", knobs{staleOpThird: true}, []string{"exclusion"}},
		{"P8 ambiguous acquire strands the key", knobs{c4AcquireDelay: 1300}, nil},
	} {
		if got := mustAgree(t, tc.name, scenario(tc.k)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: both checkers found %v broken, want %v", tc.name, got, tc.want)
		}
	}
	// TestTokenRotation's and TestOldTokenAfterRotation's histories.
	for _, tc := range []struct {
		name string
		h    history.History
	}{
		{"rotation", rotationHistory(false)},
		{"pre-rotation token accepted", rotationHistory(true)},
	} {
		mustAgree(t, tc.name, tc.h)
	}
}

// rotationHistory is a lease rotated from token 10 to 12 whose holder
// writes with both; oldAccepted makes the fence accept the old token
// after the new one: a breach of P1's rule within a lease, which the
// generative checker does not judge (not a shared invariant), so both
// keep every shared invariant on it.
func rotationHistory(oldAccepted bool) history.History {
	var b events
	b.lease(0, "c1", history.AcquireStart, "k", "", 0, 0)
	b.lease(10, "c1", history.Acquired, "k", "c1-1", 10, 900)
	b.fence(20, "k", "c1-1", 10, true, "newer", "")
	b.lease(30, "c1", history.Belief, "k", "c1-1", 12, 930)
	b.fence(31, "k", "c1-1", 12, true, "newer", "")
	b.fence(40, "k", "c1-1", 10, oldAccepted, "stale", "")
	b.lease(50, "c1", history.ReleaseStart, "k", "c1-1", 12, 0)
	b.lease(60, "c2", history.AcquireStart, "k", "", 0, 0)
	b.lease(70, "c2", history.Acquired, "k", "c2-1", 13, 970)
	b.fence(80, "k", "c2-1", 13, true, "newer", "")
	return b.h
}

// genMutation is a defect a generated history may carry, one at a time:
// the safety suite's backend mutants and the fence's, as a history shows
// them.
type genMutation int

const (
	genCorrect       genMutation = iota
	genFencingOff                // the fence accepts every write
	genTokenReused               // one grant repeats its key's last token
	genTokenZero                 // one grant has token 0
	genTokenConstant             // MutantToken: every grant has token 1
	genDoubleGrant               // MutantExpiry, MutantRelease: one grant while the key is held
	genMutations
)

var genMutationNames = [...]string{"correct", "fencing-off", "token-reused", "token-zero", "token-constant", "double-grant"}

func (m genMutation) String() string { return genMutationNames[m] }

// genHistory draws a history of up to three processes taking one or two
// keys, writing to a fenced resource that follows safety/fence's rule
// (accept a token above the key's highest, or equal from the same
// lease), with mutation m.
func genHistory(t *rapid.T, m genMutation) history.History {
	type gLease struct {
		id, proc, key string
		token         uint64
	}
	type fenceState struct {
		token uint64
		lease string
	}
	var (
		h        history.History
		now      int64
		n        int
		holders  = map[string][]*gLease{} // key → its believers
		holding  = map[string]*gLease{}   // proc → its lease
		crashed  = map[string]bool{}
		ended    = map[string][]*gLease{} // key → leases that ended
		counter  = map[string]uint64{}
		fence    = map[string]fenceState{}
		mutated  bool
		procs    = []string{"c1", "c2", "c3"}
		keys     = []string{"a", "b"}[:rapid.IntRange(1, 2).Draw(t, "keys")]
		emit     = func(e history.Event) { e.T = now * ms; h = append(h, e) }
		step     = func() { now += 10 }
		mutateIf = func(label string) bool {
			if mutated || !rapid.Bool().Draw(t, label) {
				return false
			}
			mutated = true
			return true
		}
	)
	for range rapid.IntRange(1, 30).Draw(t, "steps") {
		step()
		key := rapid.SampledFrom(keys).Draw(t, "key")
		switch rapid.IntRange(0, 8).Draw(t, "action") {
		case 0: // acquire
			proc := rapid.SampledFrom(procs).Draw(t, "proc")
			if crashed[proc] || holding[proc] != nil {
				continue
			}
			if len(holders[key]) > 0 && !(m == genDoubleGrant && mutateIf("double")) {
				continue
			}
			counter[key] += uint64(rapid.IntRange(1, 2).Draw(t, "inc"))
			tok := counter[key]
			switch {
			case m == genTokenConstant:
				tok = 1
			case m == genTokenZero && mutateIf("zero"):
				tok = 0
			case m == genTokenReused && counter[key] > 2 && mutateIf("reuse"):
				counter[key] -= 2
				tok = counter[key]
			}
			n++
			l := &gLease{id: fmt.Sprintf("%s-%d", proc, n), proc: proc, key: key, token: tok}
			emit(history.Event{Proc: proc, Kind: history.AcquireStart, Key: key})
			now += 2
			emit(history.Event{Proc: proc, Kind: history.Acquired, Key: key, Lease: l.id, Token: tok})
			holders[key] = append(holders[key], l)
			holding[proc] = l
		case 1, 2, 7, 8: // a believer writes, or a lease that ended writes late
			var l *gLease
			if rapid.IntRange(0, 2).Draw(t, "late") == 0 {
				if len(ended[key]) == 0 {
					continue
				}
				l = rapid.SampledFrom(ended[key]).Draw(t, "writer")
			} else {
				if len(holders[key]) == 0 {
					continue
				}
				l = rapid.SampledFrom(holders[key]).Draw(t, "writer")
				emit(history.Event{Proc: l.proc, Kind: history.Belief, Key: key, Lease: l.id, Token: l.token})
				now += 2
			}
			f := fence[key]
			ok := l.token > f.token || l.token == f.token && l.id == f.lease
			accepted := ok || m == genFencingOff
			if accepted && l.token > f.token {
				fence[key] = fenceState{l.token, l.id}
			}
			emit(history.Event{Proc: "fence", Kind: history.Write, Key: key, Lease: l.id, Token: l.token, Accepted: accepted, Fencing: m != genFencingOff})
		case 3: // a believer's token is rotated
			if len(holders[key]) == 0 || m == genTokenConstant {
				continue
			}
			l := rapid.SampledFrom(holders[key]).Draw(t, "rotated")
			counter[key]++
			l.token = counter[key]
			emit(history.Event{Proc: l.proc, Kind: history.Belief, Key: key, Lease: l.id, Token: l.token})
		case 4, 5, 6: // a believer releases, loses its lease, or its process is killed
			if len(holders[key]) == 0 {
				continue
			}
			i := rapid.IntRange(0, len(holders[key])-1).Draw(t, "ends")
			l := holders[key][i]
			switch rapid.IntRange(0, 2).Draw(t, "how") {
			case 0:
				emit(history.Event{Proc: l.proc, Kind: history.ReleaseStart, Key: key, Lease: l.id, Token: l.token})
				now += 2
				emit(history.Event{Proc: l.proc, Kind: history.Released, Key: key, Lease: l.id, Token: l.token})
			case 1:
				emit(history.Event{Proc: l.proc, Kind: history.Lost, Key: key, Lease: l.id, Token: l.token})
			case 2:
				emit(history.Event{Proc: l.proc, Kind: history.Crash})
				crashed[l.proc] = true
			}
			holders[key] = slices.Delete(holders[key], i, i+1)
			delete(holding, l.proc)
			ended[key] = append(ended[key], l)
		}
	}
	return h
}

// TestCheckersAgreeOnGeneratedHistories feeds both checkers random
// histories, correct and with each mutation (three of each per test
// case), and checks that they find
// the same shared invariants broken.
//
// It also checks that the generated histories exercise both checkers:
// each mutation broke a shared invariant in some history.
func TestCheckersAgreeOnGeneratedHistories(t *testing.T) {
	caught := map[genMutation]int{}
	rapid.Check(t, func(t *rapid.T) {
		for i := range 3 * int(genMutations) {
			m := genMutation(i % int(genMutations))
			h := genHistory(t, m)
			v := judge(t, h)
			if len(v.safety) > 0 {
				caught[m]++
			}
			if !v.agree() {
				t.Fatalf("%s history: the checkers disagree\n%s  history:\n%s", m, v, formatHistory(h))
			}
			if m == genCorrect && len(v.safety) > 0 {
				t.Fatalf("a correct history breaks %v\n%s", slices.Sorted(maps.Keys(v.safety)), v)
			}
		}
	})
	t.Logf("histories with a shared invariant broken, by mutation: %v", caught)
	for m := genCorrect + 1; m < genMutations; m++ {
		if caught[m] == 0 && !t.Failed() {
			t.Errorf("no %s history broke a shared invariant: the generator does not exercise it", m)
		}
	}
}

// recordMemoryRun runs three contenders for one key on the memory
// backend, each acquiring, writing through safety/fence, releasing, and
// then writing once more with its released lease's token (a paused
// holder's late write), and returns the history: the contenders' events
// and the fence's log, in the monotonic clock.
func recordMemoryRun(t *testing.T) history.History {
	t.Helper()
	srv, err := fence.Listen(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	store := memory.NewStore()
	var (
		mu sync.Mutex
		h  history.History
	)
	emit := func(e history.Event) {
		e.T = mono.Now()
		mu.Lock()
		h = append(h, e)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for p := range 3 {
		proc := fmt.Sprintf("c%d", p+1)
		c, err := fencelock.New(store.Backend(), &fencelock.Options{TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		fc, err := fence.Dial(ctx, srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer c.Close()
			defer fc.Close()
			errs <- func() error {
				for n := range 6 {
					id := fmt.Sprintf("%s-%d", proc, n)
					emit(history.Event{Proc: proc, Kind: history.AcquireStart, Key: "k", Lease: id})
					l, err := c.Acquire(ctx, "k")
					if err != nil {
						return err
					}
					tok := uint64(l.Token())
					emit(history.Event{Proc: proc, Kind: history.Acquired, Key: "k", Lease: id, Token: tok, Until: mono.Now() + int64(l.Remaining())})
					for range 2 {
						emit(history.Event{Proc: proc, Kind: history.Belief, Key: "k", Lease: id, Token: tok, Until: mono.Now() + int64(l.Remaining())})
						if _, err := fc.Write(ctx, "k", id, proc, tok); err != nil {
							return err
						}
					}
					emit(history.Event{Proc: proc, Kind: history.ReleaseStart, Key: "k", Lease: id, Token: tok})
					err = l.Release(ctx)
					emit(history.Event{Proc: proc, Kind: history.Released, Key: "k", Lease: id, Token: tok, Err: errString(err)})
					if err != nil {
						return err
					}
					if _, err := fc.Write(ctx, "k", id, proc, tok); err != nil { // late
						return err
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return append(h, srv.Log()...)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestCheckersAgreeOnRecordedHistories feeds both checkers a history
// recorded on the memory backend, which keeps every invariant, and the
// same history with each defect a broken store or fence would put in it
// (the safety suite's mutants: every token 1; a holder that keeps
// believing past the next grant, as with the expiry check removed or a
// release without owner check; the fence with fencing off), and checks
// that both find the same shared invariants broken, and the ones each
// defect breaks.
func TestCheckersAgreeOnRecordedHistories(t *testing.T) {
	rec := recordMemoryRun(t)
	rec.Sort()
	mutate := func(f func(h history.History) history.History) history.History {
		return f(append(history.History(nil), rec...))
	}
	for _, tc := range []struct {
		name string
		h    history.History
		want []string
	}{
		{"recorded", rec, nil},
		{"every token 1", mutate(func(h history.History) history.History {
			for i := range h {
				if h[i].Token != 0 {
					h[i].Token = 1
				}
			}
			return h
		}), []string{"tokens"}},
		{"holder believes past the next grant", mutate(func(h history.History) history.History {
			// The first released lease starts its release (and ends its
			// belief) only after the next lease was acquired.
			first := slices.IndexFunc(h, func(e history.Event) bool { return e.Kind == history.ReleaseStart })
			next := slices.IndexFunc(h[first:], func(e history.Event) bool { return e.Kind == history.Acquired })
			h[first].T = h[first+next].T + int64(time.Millisecond)
			return h
		}), []string{"exclusion"}},
		{"fencing off", mutate(func(h history.History) history.History {
			for i := range h {
				if h[i].Kind == history.Write {
					h[i].Accepted, h[i].Fencing = true, false
				}
			}
			return h
		}), []string{"stale-write"}},
	} {
		got := mustAgree(t, tc.name, tc.h)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: both checkers found %v broken, want %v", tc.name, got, tc.want)
		}
	}
}
