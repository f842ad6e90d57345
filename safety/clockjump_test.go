package safety

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/safety/suite"
)

// libfaketime is Debian's faketime package's preload library, which
// scripts/testenv installs with PostgreSQL.
const libfaketime = testenv.LibFaketime

// faketimePostgres is a PostgreSQL server of the test's own, run under
// libfaketime: its wall clock is the real one plus the offset in a file
// that ClockJump rewrites (FAKETIME_NO_CACHE: read at every clock call).
// The monotonic clock is not faked.
type faketimePostgres struct {
	dir, bin, url string
	mu            sync.Mutex
	offset        time.Duration
}

// startFaketimePostgres starts it, or returns why it cannot (no
// libfaketime, no PostgreSQL binaries).
func startFaketimePostgres(t *testing.T) (*faketimePostgres, error) {
	t.Helper()
	if _, err := os.Stat(libfaketime); err != nil {
		return nil, fmt.Errorf("libfaketime not installed (apt-get install faketime): %w", err)
	}
	bin := ""
	if ds, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(ds) > 0 {
		bin = filepath.Dir(ds[len(ds)-1])
	} else if p, err := exec.LookPath("initdb"); err == nil {
		bin = filepath.Dir(p)
	} else {
		return nil, errors.New("no PostgreSQL server binaries (initdb)")
	}
	dir, err := os.MkdirTemp("", "fl-pgft")
	if err != nil {
		return nil, err
	}
	s := &faketimePostgres{dir: dir, bin: bin}
	t.Cleanup(func() {
		s.pgctl("-D", filepath.Join(dir, "data"), "-m", "immediate", "stop")
		os.RemoveAll(dir)
	})
	if err := os.WriteFile(s.offsetFile(), []byte("+0\n"), 0o666); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, err
	}
	os.Chmod(s.offsetFile(), 0o666)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	if out, err := s.run(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "postgres", "--auth=trust"); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", port, dir)
	if out, err := s.pgctl("-D", filepath.Join(dir, "data"), "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "start"); err != nil {
		return nil, fmt.Errorf("pg_ctl start under faketime: %v: %s", err, out)
	}
	s.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return s, nil
}

func (s *faketimePostgres) offsetFile() string { return filepath.Join(s.dir, "faketime") }

// run runs a server binary, as user postgres when the test runs as root
// (PostgreSQL refuses to run as root).
func (s *faketimePostgres) run(name string, args ...string) (string, error) {
	if os.Getuid() == 0 {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = runuser()
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+libfaketime, "FAKETIME_TIMESTAMP_FILE="+s.offsetFile(),
		"FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// runuser returns the path of runuser(1): from PATH, else from the
// system directories a minimal PATH (a CI runner's, say) leaves out.
func runuser() string {
	if p, err := exec.LookPath("runuser"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/runuser", "/sbin/runuser"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "runuser"
}

func (s *faketimePostgres) pgctl(args ...string) (string, error) {
	return s.run(filepath.Join(s.bin, "pg_ctl"), args...)
}

// control is the suite.Control whose ClockJump moves the server's clock.
func (s *faketimePostgres) control() *suite.Control {
	return &suite.Control{
		ClockJump: func(ctx context.Context, d time.Duration) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.offset += d
			// Write a new file and rename it: the server never reads half a line.
			tmp := s.offsetFile() + ".new"
			if err := os.WriteFile(tmp, []byte("+"+strconv.FormatFloat(s.offset.Seconds(), 'f', 3, 64)+"\n"), 0o666); err != nil {
				return err
			}
			return os.Rename(tmp, s.offsetFile())
		},
		Setup: map[string]string{suite.FaultClockJump: "PostgreSQL under libfaketime (wall clock only); its clock jumps forward by 2×TTL while a lock is held"},
	}
}
