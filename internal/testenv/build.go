package testenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// goTool returns the go command: from PATH, else /usr/local/go/bin/go.
func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if fi, err := os.Stat("/usr/local/go/bin/go"); err == nil && !fi.IsDir() {
		return "/usr/local/go/bin/go", nil
	}
	return "", errors.New("testenv: Go toolchain not found (looked in PATH and /usr/local/go/bin)")
}

var buildMu sync.Map // binary name -> *sync.Mutex: one build of a tool at a time in this process

// goBuild builds the tools module in dir (with GOWORK=off: the tools are
// not in go.work) into cache/bin/NAME-HASH and returns that path, reusing
// it when present. HASH covers the Go version, the flags and the module's
// top-level sources, computed exactly as scripts/testenv used to, so that
// binaries built by either are shared. Builds older than a week are
// deleted.
func (e *Env) goBuild(ctx context.Context, dir, name string, flags ...string) (string, error) {
	goBin, err := goTool()
	if err != nil {
		return "", err
	}
	if !fileExists(filepath.Join(dir, "go.mod")) {
		return "", fmt.Errorf("testenv: no go.mod in %s", dir)
	}
	ver, err := exec.CommandContext(ctx, goBin, "version").Output()
	if err != nil {
		return "", fmt.Errorf("testenv: go version: %w", err)
	}
	// sha256 of: `go version`, one line per flag (an empty line when there
	// is none), then `sha256sum` lines of *.go, go.mod, go.sum in C order.
	var in bytes.Buffer
	in.Write(ver)
	if len(flags) == 0 {
		in.WriteString("\n")
	}
	for _, f := range flags {
		in.WriteString(f + "\n")
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var files []string
	for _, de := range ents {
		n := de.Name()
		if de.Type().IsRegular() && (strings.HasSuffix(n, ".go") || n == "go.mod" || n == "go.sum") {
			files = append(files, n)
		}
	}
	sort.Strings(files)
	for _, n := range files {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(&in, "%s  ./%s\n", hex.EncodeToString(sum[:]), n)
	}
	sum := sha256.Sum256(in.Bytes())
	binDir := filepath.Join(e.cache, "bin")
	out := filepath.Join(binDir, name+"-"+hex.EncodeToString(sum[:])[:16])

	mu, _ := buildMu.LoadOrStore(name, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	if fi, err := os.Stat(out); err == nil && fi.Mode()&0o111 != 0 {
		return out, nil
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", err
	}
	tmp := out + ".tmp." + strconv.Itoa(os.Getpid())
	e.logf("building %s from %s (once; cached in %s)", name, e.rel(dir), binDir)
	args := append([]string{"build", "-trimpath"}, flags...)
	args = append(args, "-o", tmp, ".")
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -buildvcs=false"))
	var msgs bytes.Buffer
	cmd.Stdout = io.MultiWriter(&msgs, e.logWriter())
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("testenv: building %s failed: %w\n%s", name, err, msgs.String())
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	e.logf("built %s", name)
	// Older builds go a week after they were built: a state dir made before
	// this one (another checkout's, a concurrent run's) may still start its
	// server from one of them.
	old, _ := filepath.Glob(filepath.Join(binDir, name+"-*"))
	for _, p := range old {
		if p == out || strings.Contains(filepath.Base(p), ".tmp.") {
			continue
		}
		if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) > 7*24*time.Hour {
			_ = os.Remove(p)
		}
	}
	return out, nil
}

// installPackages runs scripts/install-servers (apt-get, as root or with
// password-less sudo) for the missing Debian packages, and for the
// PostgreSQL system user when it is missing.
func (e *Env) installPackages(ctx context.Context, pkgs []string, user string) error {
	if e.root == "" {
		return errors.New("testenv: the checkout (scripts/install-servers) was not found")
	}
	args := []string{}
	if user != "" {
		args = append(args, "--system-user", user)
	}
	args = append(args, pkgs...)
	e.logf("scripts/install-servers %s", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, filepath.Join(e.root, "scripts", "install-servers"), args...)
	cmd.Stdout = e.logWriter()
	cmd.Stderr = e.logWriter()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("testenv: scripts/install-servers %s: %w", strings.Join(args, " "), err)
	}
	return nil
}
