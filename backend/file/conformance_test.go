//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package file_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/file"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
)

// TestConformance runs the shared suite on a fresh lock directory, with
// the default settings (sync on). Set FENCELOCK_FILE_NOSYNC=1 to run it
// with sync=false.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	// FENCELOCK_FILE_TEST_TTL sets the suite's TTL (default 1s).
	ttl := time.Second
	if v := os.Getenv("FENCELOCK_FILE_TEST_TTL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FENCELOCK_FILE_TEST_TTL: %v", err)
		}
		ttl = d
	}
	opts := &file.Options{Dir: dir, NoSync: os.Getenv("FENCELOCK_FILE_NOSYNC") == "1"}
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) { return file.New(ctx, opts) },
		TTL:  ttl,
		// A "restart" of a directory store is every process going away:
		// nothing to kill, the files are the store. Reopening proves the
		// counters are read back from disk.
		Restart: func(context.Context) error { return nil },
	})
}
