package resource_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance/resource"
)

// A suite that cannot fail is worth nothing. Each mutant below is a
// resource with one defect of the kind a hand-written fence has; the suite
// must fail it, in the case named (and may fail it in others too).

type mark struct {
	token  fencelock.Token
	holder string
}

// rule is the fencing rule a mutant applies (correct: fencelock.Fence's).
type rule func(seen mark, token fencelock.Token, holder string) bool

func correct(seen mark, token fencelock.Token, holder string) bool {
	return token > seen.token || (token == seen.token && holder == seen.holder && token != 0)
}

// mutantResource is the rule in front of a map, with a defect switched on.
type mutantResource struct {
	admit         rule
	refusedWrites bool // a refused write still stores its value
	refusedMarks  bool // a refused write still records its holder
	nonAtomic     bool // check, yield, then record and write: not one step
	oneMark       bool // one record for every name
	tokens64      bool // Harness.Tokens64

	mu    sync.Mutex
	marks map[string]mark
	vals  map[string]string
}

func (m *mutantResource) key(name string) string {
	if m.oneMark {
		return ""
	}
	return name
}

func (m *mutantResource) Write(_ context.Context, name string, token fencelock.Token, holder, value string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.marks == nil {
		m.marks, m.vals = map[string]mark{}, map[string]string{}
	}
	seen := m.marks[m.key(name)]
	if !m.admit(seen, token, holder) {
		if m.refusedWrites {
			m.vals[name] = value
		}
		if m.refusedMarks {
			m.marks[m.key(name)] = mark{seen.token, holder}
		}
		return &fencelock.StaleTokenError{Resource: name, Token: token, Highest: seen.token}
	}
	if m.nonAtomic {
		// The check was a read; the write is another step, as when a
		// resource reads the fence, compares in the client, then writes.
		m.mu.Unlock()
		runtime.Gosched()
		m.mu.Lock()
	}
	m.marks[m.key(name)] = mark{token, holder}
	m.vals[name] = value
	return nil
}

func (m *mutantResource) Read(_ context.Context, name string) (string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.vals[name]
	return v, ok, nil
}

type mutant struct {
	name     string
	wantFail string // the case that must catch it
	make     func() *mutantResource
}

var mutants = []mutant{
	{"comparison-removed", "RuleTable", func() *mutantResource {
		return &mutantResource{admit: func(mark, fencelock.Token, string) bool { return true }}
	}},
	{"equal-token-refused", "SameHolderRewrite", func() *mutantResource {
		// < for ≤: only a higher token passes; a live holder cannot write again.
		return &mutantResource{admit: func(s mark, t fencelock.Token, _ string) bool { return t > s.token }}
	}},
	{"holder-check-dropped", "RefusalChangesNothing", func() *mutantResource {
		// ≤ without the holder: an equal token from anyone passes.
		return &mutantResource{admit: func(s mark, t fencelock.Token, _ string) bool { return t > s.token || (t == s.token && t != 0) }}
	}},
	{"compared-as-float64", "ExactTokensPast2to53", func() *mutantResource {
		return &mutantResource{admit: func(s mark, t fencelock.Token, h string) bool {
			a, b := float64(t), float64(s.token)
			return a > b || (a == b && h == s.holder && t != 0)
		}}
	}},
	{"compared-as-int64", "Tokens64", func() *mutantResource {
		return &mutantResource{tokens64: true, admit: func(s mark, t fencelock.Token, h string) bool {
			a, b := int64(t), int64(s.token)
			return a > b || (a == b && h == s.holder && t != 0)
		}}
	}},
	{"refused-write-changes-value", "RefusalChangesNothing", func() *mutantResource {
		return &mutantResource{admit: correct, refusedWrites: true}
	}},
	{"refused-write-records-holder", "RefusalChangesNothing", func() *mutantResource {
		return &mutantResource{admit: correct, refusedMarks: true}
	}},
	{"check-then-write-not-atomic", "ConcurrentWritersInterleaved", func() *mutantResource {
		return &mutantResource{admit: correct, nonAtomic: true}
	}},
	{"one-record-for-all-names", "NamesAreIndependent", func() *mutantResource {
		return &mutantResource{admit: correct, oneMark: true}
	}},
}

// TestHelperMutantResource runs the suite on the mutant named by the
// environment; it is the child process of TestSuiteCatchesBrokenResources.
func TestHelperMutantResource(t *testing.T) {
	name := os.Getenv("FENCELOCK_RESOURCE_MUTANT")
	if name == "" {
		t.Skip("helper process for TestSuiteCatchesBrokenResources")
	}
	for _, m := range mutants {
		if m.name == name {
			r := m.make()
			resource.Run(t, resource.Harness{
				Resource: func(*testing.T) resource.Resource { return r },
				Tokens64: r.tokens64,
			})
			return
		}
	}
	t.Fatalf("unknown mutant %q", name)
}

// TestCorrectMutantResourcePasses: the mutants' resource with no defect
// switched on passes, so each mutant fails for its defect alone.
func TestCorrectMutantResourcePasses(t *testing.T) {
	r := &mutantResource{admit: correct, tokens64: true}
	resource.Run(t, resource.Harness{Resource: func(*testing.T) resource.Resource { return r }, Tokens64: true})
}

var failedCase = regexp.MustCompile(`--- FAIL: TestHelperMutantResource/(\w+)`)

// TestSuiteCatchesBrokenResources runs the whole suite on each mutant in a
// child process and requires it to fail in the case named; it logs every
// case that caught the mutant.
func TestSuiteCatchesBrokenResources(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite once per mutant")
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperMutantResource$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "FENCELOCK_RESOURCE_MUTANT="+m.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a resource with %s; output:\n%s", m.name, out)
			}
			var caught []string
			for _, f := range failedCase.FindAllStringSubmatch(string(out), -1) {
				caught = append(caught, f[1])
			}
			if !slices.Contains(caught, m.wantFail) {
				t.Fatalf("mutant %s was not caught by case %s (caught by %v); output:\n%s", m.name, m.wantFail, caught, out)
			}
			if !strings.Contains(string(out), "history") {
				t.Errorf("the failing cases did not report the history of writes; output:\n%s", out)
			}
			if strings.Contains(string(out), "DATA RACE") {
				t.Errorf("the mutant raced (so it may have failed for the race, not its defect); output:\n%s", out)
			}
			t.Log(fmt.Sprintf("%s caught by %s", m.name, strings.Join(caught, ", ")))
		})
	}
}
