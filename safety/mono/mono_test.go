package mono

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// TestNowIsMonotonic: successive readings never go backwards and advance
// with real time.
func TestNowIsMonotonic(t *testing.T) {
	prev := Now()
	for range 10000 {
		n := Now()
		if n < prev {
			t.Fatalf("Now went backwards: %d after %d", n, prev)
		}
		prev = n
	}
	start := Now()
	time.Sleep(20 * time.Millisecond) // the elapsed time is what is measured
	if d := time.Duration(Now() - start); d < 20*time.Millisecond || d > 5*time.Second {
		t.Fatalf("20ms sleep measured as %v", d)
	}
}

// TestNowIsSystemWide: a reading taken in a child process lies between two
// readings of the parent, which holds only for a clock shared by processes.
func TestNowIsSystemWide(t *testing.T) {
	if os.Getenv("MONO_TEST_CHILD") == "1" {
		os.Stdout.WriteString(strconv.FormatInt(Now(), 10))
		os.Exit(0)
	}
	before := Now()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNowIsSystemWide$")
	cmd.Env = append(os.Environ(), "MONO_TEST_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	after := Now()
	child, err := strconv.ParseInt(string(out), 10, 64)
	if err != nil {
		t.Fatalf("child output %q: %v", out, err)
	}
	if child < before || child > after {
		t.Fatalf("child reading %d not within parent's [%d, %d]", child, before, after)
	}
}
