package fencelock_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestRootSurfaceFitsOneScreen keeps the root package learnable: `go doc
// -short` of it (every exported top-level name, one line each) fits in 35
// lines, and names that only the recipes or the project's own checkers
// would use stay out of it (they live in package recipe, or are not
// exported at all).
func TestRootSurfaceFitsOneScreen(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go doc")
	}
	out, err := exec.Command("go", "doc", "-short", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go doc -short .: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > 35 {
		t.Errorf("go doc -short . prints %d lines; keep the root's surface within 35:\n%s", len(lines), out)
	}
	for _, name := range []string{"Semaphore", "RWLock", "RWGrant", "Leader", "ElectOptions", "Permit", "MaxPermits", "MaxReaders", "PermitSeparator", "RWSeparator"} {
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) >= 2 && strings.TrimSuffix(f[1], "(") == name {
				t.Errorf("the root exports %s (%q); recipes live in package recipe", name, l)
			}
		}
	}
}
