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
// history does not record) and are not compared.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/safety/history"
)

// crossConfig is the configuration both checkers are compared under.
var crossConfig = Config{TTL: time.Second, Poll: 100 * time.Millisecond, Slack: time.Nanosecond}

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
}

// replayOf writes h (a single-lock history: no semaphore or read-write
// lock keys) in the generative checker's terms: a lease's window runs
// from its Acquired to the earliest of its Lost, its ReleaseStart, the
// first Crash of its process after it was acquired and the largest Until
// it reported (the belief interval of the package doc); a write is the
// fence's Write, invoked and answered at its T.
func replayOf(t testing.TB, h history.History) generative.Replay {
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
		if e.Kind != history.Write || e.Access != "" || !known {
			continue // a write by a lease never acquired: the generative history has none
		}
		l := rp.Leases[i]
		rp.Writes = append(rp.Writes, generative.ReplayWrite{
			Lease: i, Token: fencelock.Token(e.Token), Invoked: e.T, Returned: e.T, Accepted: e.Accepted,
			Late: l.End != 0 && e.T >= l.End,
		})
	}
	return rp
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
// broken (possibly none).
func (v verdicts) agree() bool {
	return slices.Equal(slices.Sorted(maps.Keys(v.safety)), slices.Sorted(maps.Keys(v.generative)))
}

// judge feeds h to both checkers and returns their verdicts on the
// shared invariants.
func judge(t testing.TB, h history.History) verdicts {
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
