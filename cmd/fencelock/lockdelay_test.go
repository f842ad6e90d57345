package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunLockDelay: with --lock-delay, a key whose holder was killed
// (never released) is refused for the delay after its lease ended, and a
// waiting run takes it once the delay is over; a released key is free at
// once.
func TestRunLockDelay(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "trap")
	h, _ := f.holder("jobs/delayed", out, "--ttl", "1s", "--lock-delay", "3s")
	h.Process.Kill()
	waitExit(t, h, 30*time.Second)
	// The record expires within the TTL; the delay runs 3s past it.
	deadline := time.Now().Add(3 * time.Second)
	for {
		_, stderr, code := f.run("run", "--no-wait", "--ttl", "1s", "--lock-delay", "3s", "jobs/delayed", "--", "true")
		if code == exitNotAcquired && strings.Contains(stderr, "lock delay") {
			break
		}
		if code != exitNotAcquired || time.Now().After(deadline) {
			t.Fatalf("run --no-wait --lock-delay 3s after the holder was killed: exit %d; want %d with the lock delay named\n%s", code, exitNotAcquired, stderr)
		}
		time.Sleep(50 * time.Millisecond) // polling the key's state: no event to await
	}
	if _, stderr, code := f.run("run", "--timeout", "20s", "--ttl", "1s", "--lock-delay", "3s", "jobs/delayed", "--", "true"); code != 0 {
		t.Fatalf("waiting run through the lock delay: exit %d\n%s", code, stderr)
	}
	for i := range 2 {
		if _, stderr, code := f.run("run", "--no-wait", "--lock-delay", "1h", "jobs/released", "--", "true"); code != 0 {
			t.Fatalf("run %d --no-wait --lock-delay 1h of a released key: exit %d; want 0: a release frees the key at once\n%s", i, code, stderr)
		}
	}
	if _, stderr, code := f.run("run", "--lock-delay", "5", "k", "--", "true"); code != exitUsage || !strings.Contains(stderr, "did you mean 5s?") {
		t.Errorf("run --lock-delay 5: exit %d; want %d naming the unit\n%s", code, exitUsage, stderr)
	}
}
