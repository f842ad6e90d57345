package suite

import (
	"fmt"
	"os/exec"
	"testing"
)

const zkRace = `==================
WARNING: DATA RACE
Write at 0x00c0001ee000 by goroutine 77:
  github.com/go-zookeeper/zk.(*Conn).recvLoop()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:849 +0xc4c
  github.com/go-zookeeper/zk.(*Conn).loop.func2()

Previous read at 0x00c0001ee000 by goroutine 8:
  github.com/go-zookeeper/zk.(*Conn).sendSetWatches()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:614 +0x472
  github.com/go-zookeeper/zk.(*Conn).loop()

Goroutine 8 (running) created at:
  github.com/go-zookeeper/zk.Connect()
  github.com/fencelock/fencelock/backend/zookeeper.dial()
==================
`

const ourRace = `==================
WARNING: DATA RACE
Write at 0x00c000 by goroutine 12:
  github.com/fencelock/fencelock.(*Lease).release()
Previous read at 0x00c000 by goroutine 9:
  github.com/fencelock/fencelock.(*Client).renewBatch()
==================
`

func exitWith(t *testing.T, code int) error {
	t.Helper()
	err := exec.Command("sh", "-c", fmt.Sprintf("exit %d", code)).Run()
	if err == nil {
		t.Fatal("sh exited 0")
	}
	return fmt.Errorf("proc: c2: %w\n(tail)", err)
}

// TestOnlyDepRaces: a contender stopped by the race detector is excused
// only when every race it reported is a known dependency race.
func TestOnlyDepRaces(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   int
		stderr string
		want   bool
	}{
		{"the go-zookeeper race alone", 66, "log line\n" + zkRace + "Found 1 data race(s)\n", true},
		{"twice", 66, zkRace + zkRace, true},
		{"with a race of ours", 66, zkRace + ourRace, false},
		{"a race of ours alone", 66, ourRace, false},
		{"exit 66 without a report", 66, "panic: something\n", false},
		{"another exit status", 1, zkRace, false},
		{"only one of the two frames", 66, "WARNING: DATA RACE\n  github.com/go-zookeeper/zk.(*Conn).recvLoop()\n==================\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names, ok := onlyDepRaces(exitWith(t, tc.code), tc.stderr)
			if ok != tc.want {
				t.Fatalf("onlyDepRaces = %v (%q); want %v", ok, names, tc.want)
			}
			if ok && len(names) == 0 {
				t.Fatal("excused without naming the race")
			}
		})
	}
	if _, ok := onlyDepRaces(nil, zkRace); ok {
		t.Fatal("a clean exit is not a race exit")
	}
}
