package fencelock_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/memory" // mem://
	"github.com/fencelock/fencelock/driver"
)

func TestOpenMem(t *testing.T) {
	ctx := t.Context()
	a, err := fencelock.Open(ctx, "mem://open-test?ttl=2s&renew_interval=500ms&owner=svc-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if o := a.Options(); o.TTL != 2*time.Second || o.RenewInterval != 500*time.Millisecond || o.Owner != "svc-a" {
		t.Errorf("URL options not applied: %+v", o)
	}
	// Explicit options win over the URL.
	b, err := fencelock.Open(ctx, "MEM://open-test?ttl=2s", &fencelock.Options{TTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Options().TTL != 4*time.Second {
		t.Errorf("explicit TTL lost to the URL's: %v", b.Options().TTL)
	}
	// Same name, same store.
	l, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "k"); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("second client on mem://open-test: %v; want ErrNotAcquired", err)
	}
	var held *fencelock.HeldError
	if _, err := b.TryAcquire(ctx, "k"); !errors.As(err, &held) || held.Holder.Owner != l.Owner() {
		t.Errorf("HeldError does not name the holder: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	_, err := fencelock.Open(ctx, "nosuch://user:hunter2@db.example:1234/x", nil)
	if !errors.Is(err, fencelock.ErrUnknownScheme) {
		t.Fatalf("unknown scheme: %v", err)
	}
	for _, want := range []string{`"nosuch"`, "known schemes: ", "mem"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("password in error: %v", err)
	}
	_, err = fencelock.Open(ctx, "mem://x?tll=3s", nil)
	var oe *fencelock.InvalidOptionError
	if !errors.As(err, &oe) || !strings.Contains(err.Error(), "tll") {
		t.Errorf("unknown parameter: %v; want an *InvalidOptionError naming it", err)
	}
	if _, err := fencelock.Open(ctx, "mem://x?ttl=soon", nil); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Errorf("malformed ttl: %v", err)
	}
	if _, err := fencelock.Open(ctx, "mem://x?ttl=1ms", nil); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Errorf("ttl out of range: %v", err)
	}
	if _, err := fencelock.Open(ctx, "mem://u:s3cret@x", nil); !errors.Is(err, fencelock.ErrInvalidOption) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("mem URL with a password: %v; want ErrInvalidOption, without the password", err)
	}
	if c, err := fencelock.Open(ctx, "MEM:opaque-name", nil); err != nil {
		t.Errorf("mem:NAME: %v", err)
	} else {
		c.Close()
	}
	_, err = fencelock.Open(ctx, "postgres://u:s3cret@%zz/db", nil)
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("unparsable URL: %v (must fail without showing the password)", err)
	}
}

func TestRegisterRejectsDuplicates(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("registering mem twice did not panic")
		}
	}()
	fencelock.Register("MEM", func(context.Context, *url.URL) (fencelock.Backend, error) { return nil, nil })
}

func TestParamsRejectUnknown(t *testing.T) {
	u, _ := url.Parse("x://h/?table=t&timeout=2s&tabel=oops")
	p := driver.NewParams(u)
	if got := p.String("table", "d"); got != "t" {
		t.Errorf("table = %q", got)
	}
	if got := p.Duration("timeout", 0); got != 2*time.Second {
		t.Errorf("timeout = %v", got)
	}
	err := p.Err()
	if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), `"tabel"`) || !strings.Contains(err.Error(), "table, timeout") {
		t.Errorf("Err() = %v; want the unknown parameter and the known ones", err)
	}
}

// TestCoreHasNoThirdPartyDependencies checks that a program importing the
// core (and the memory backend and conformance suite) links only the
// standard library: a user of one backend must not get every backend's
// dependencies.
func TestCoreHasNoThirdPartyDependencies(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go command not found: %v", err)
	}
	list := func(args ...string) []string {
		cmd := exec.Command(gobin, append([]string{"list"}, args...)...)
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		return strings.Fields(string(out))
	}
	// Every package of the module but the generative mode, a harness for
	// backend authors' tests, built on pgregory.net/rapid: what a user
	// compiles needs nothing outside the standard library.
	var core []string
	for _, p := range list("./...") {
		if p != "github.com/fencelock/fencelock/conformance/generative" {
			core = append(core, p)
		}
	}
	for _, p := range list(append([]string{"-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, core...)...) {
		if !strings.HasPrefix(p, "github.com/fencelock/fencelock") {
			t.Errorf("core module package graph includes third-party package %s", p)
		}
		if p == "github.com/fencelock/fencelock/conformance/generative" {
			t.Errorf("a core package imports the generative mode (and with it rapid)")
		}
	}
	for _, p := range list("-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./conformance/generative") {
		if !strings.HasPrefix(p, "github.com/fencelock/fencelock") && !strings.HasPrefix(p, "pgregory.net/rapid") {
			t.Errorf("the generative mode's package graph includes %s: only pgregory.net/rapid is expected", p)
		}
	}
}

// goList runs go list with args in the root module's directory.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go command not found: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, gobin, append([]string{"list"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Fields(string(out))
}

// TestRootImportsNoBackend checks that the root package's import graph
// holds no backend package: every backend, mem:// included, registers its
// schemes from its own init, so a program links only the backends it
// imports, and no backend's code is a hidden part of the engine.
func TestRootImportsNoBackend(t *testing.T) {
	deps := goList(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	if !slices.Contains(deps, "github.com/fencelock/fencelock") {
		t.Fatalf("go list -deps . = %v: the root package itself is missing", deps)
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "github.com/fencelock/fencelock/backend/") {
			t.Errorf("the root package's import graph includes %s", p)
		}
	}
}

// TestOpenMemWithoutTheImportSaysWhichToAdd runs a program that opens
// mem:// without importing backend/memory: Open must fail with
// ErrUnknownScheme and name the import that registers the scheme.
func TestOpenMemWithoutTheImportSaysWhichToAdd(t *testing.T) {
	if deps := goList(t, "-deps", "./testdata/nomem"); slices.Contains(deps, "github.com/fencelock/fencelock/backend/memory") {
		t.Fatalf("testdata/nomem links backend/memory; it must not")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go command not found: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, gobin, "run", "./testdata/nomem").CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./testdata/nomem: %v\n%s", err, out)
	}
	for _, want := range []string{"errors.Is ErrUnknownScheme: true;", `add import _ "github.com/fencelock/fencelock/backend/memory"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("Open(\"mem://x\") without backend/memory said:\n%s\nwant it to contain %s", out, want)
		}
	}
}

// TestOpenTTLFromURLFollowsTheFlagRule checks that a URL's ttl parameter
// is refused for the values --ttl refuses (zero, below the floor, a bare
// number), rather than silently taken for the default.
func TestOpenTTLFromURLFollowsTheFlagRule(t *testing.T) {
	for _, v := range []string{"0", "0s", "10ms", "5", ""} {
		c, err := fencelock.Open(t.Context(), "mem://ttlrule?ttl="+v, nil)
		if !errors.Is(err, fencelock.ErrInvalidOption) || !strings.Contains(err.Error(), `"ttl"`) {
			if c != nil {
				c.Close()
			}
			t.Errorf("Open(mem://ttlrule?ttl=%s) = %v; want ErrInvalidOption naming the ttl parameter", v, err)
		}
	}
	c, err := fencelock.Open(t.Context(), "mem://ttlrule?ttl=2s", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
