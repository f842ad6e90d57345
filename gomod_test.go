package fencelock_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goDirective matches a go.mod or go.work "go" line.
var goDirective = regexp.MustCompile(`(?m)^go\s+(\S+)\s*$`)

// TestGoDirectivesAgree checks that the project states one minimum Go
// version: every go.mod in the repository (the core, each backend, bench,
// observe, migrate, safety, cmd and tools module) and go.work carry the
// root module's go directive, and the README names it. A module that needs
// a newer Go (through a dependency) must raise it everywhere, README
// included, rather than leave the core claiming an older one it was never
// tested with as a whole.
func TestGoDirectivesAgree(t *testing.T) {
	root, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := goDirective.FindSubmatch(root)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	want := string(m[1])
	files := []string{"go.work"}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "go.mod" && path != "go.mod" {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found only %d go.mod/go.work files besides the root's: %v", len(files), files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m := goDirective.FindSubmatch(b)
		switch {
		case m == nil:
			t.Errorf("%s has no go directive; want go %s", f, want)
		case string(m[1]) != want:
			t.Errorf("%s says go %s; the root module says go %s: keep one minimum Go version for the project", f, m[1], want)
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	short := strings.TrimSuffix(want, ".0")
	if !strings.Contains(string(readme), "Go "+short+" or later") {
		t.Errorf("README.md does not state the minimum Go version (want the phrase %q)", "Go "+short+" or later")
	}
}
