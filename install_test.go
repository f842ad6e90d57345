package fencelock_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmeBlock returns the body of the first fenced block of README.md
// that follows heading and opens with fence (e.g. "```go").
func readmeBlock(t *testing.T, heading, fence string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no %q section", heading)
	}
	j := strings.Index(s[i:], "\n"+fence+"\n")
	if j < 0 {
		t.Fatalf("README.md's %q section has no %s block", heading, fence)
	}
	body := s[i+j+len(fence)+2:]
	return body[:strings.Index(body, "\n```")+1]
}

// TestPackageDocShowsTheREADMEProgram checks that the package
// documentation's first program is the README's, line for line.
func TestPackageDocShowsTheREADMEProgram(t *testing.T) {
	prog := readmeBlock(t, "## A first program", "```go")
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var inDoc []string
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "//\t"):
			inDoc = append(inDoc, strings.TrimPrefix(l, "//\t"))
		case len(inDoc) > 0 && l == "//":
			inDoc = append(inDoc, "")
		}
	}
	got := strings.TrimSpace(strings.Join(inDoc, "\n"))
	if want := strings.TrimSpace(prog); !strings.HasPrefix(got, want) {
		t.Errorf("doc.go's example differs from the README's first program:\n--- doc.go\n%s\n--- README.md\n%s", got, want)
	}
}

// TestInstallFromClone follows the README's install section as a user
// would before a release: a scratch module requiring the engine and one
// backend, with the README's replace block pointing at this clone, and the
// README's first program as its main package. It must resolve (go mod
// tidy) and build with nothing else of the repository in its module
// graph, and none of the other backends' client libraries.
func TestInstallFromClone(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with a backend's client library")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go command is not on PATH")
	}
	clone, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mod := readmeBlock(t, "## Install", "```gomod")
	mod = strings.ReplaceAll(mod, "../fencelock", clone)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/first\n\ngo 1.26.0\n\n"+mod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(readmeBlock(t, "## A first program", "```go")), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s in a module made from the README: %v\n%s\ngo.mod:\n%s", strings.Join(args, " "), err, out, mod)
		}
		return string(out)
	}
	run("mod", "tidy")
	run("build", "-o", filepath.Join(dir, "first"), ".")
	graph := run("list", "-m", "all")
	for _, line := range strings.Split(strings.TrimSpace(graph), "\n") {
		path := strings.Fields(line)[0]
		switch {
		case path == "example.com/first", path == "github.com/fencelock/fencelock", path == "github.com/fencelock/fencelock/backend/redis":
		case strings.HasPrefix(path, "github.com/fencelock/"):
			t.Errorf("module graph of a Redis-only consumer holds %s: a module of the repository it did not ask for", path)
		case strings.Contains(path, "pgx"), strings.Contains(path, "mongo-driver"), strings.Contains(path, "etcd"), strings.Contains(path, "go-zookeeper"):
			t.Errorf("module graph of a Redis-only consumer holds %s: another backend's client library", path)
		}
	}
}
