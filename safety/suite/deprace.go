package suite

import (
	"errors"
	"os/exec"
	"strings"
)

// A dependency race is a data race inside a library fencelock uses,
// reported upstream and not fixed in any released version. The race
// detector stops a contender that hits one (exit status 66) as it would
// for a race of ours; a contender stopped only for known dependency races
// does not fail its cell, and the cell's setup names them.
type depRace struct {
	name   string
	frames []string // every one appears in the report
}

var depRaces = []depRace{{
	// go-zookeeper v1.0.4 (the latest release) reads Conn.lastZxid in
	// sendSetWatches, on the loop goroutine, right after it started the
	// recvLoop goroutine that writes it for every reply: upstream
	// go-zookeeper/zk#35 (the fix, open since 2020) and
	// samuel/go-zookeeper#260. It needs a reconnection while watches are
	// set and requests are queued: the ensemble cells cause exactly that.
	name:   "go-zookeeper Conn.lastZxid (recvLoop vs sendSetWatches, go-zookeeper/zk#35)",
	frames: []string{"go-zookeeper/zk.(*Conn).recvLoop(", "go-zookeeper/zk.(*Conn).sendSetWatches("},
}}

// raceExit is the race detector's exit status (GORACE exitcode default).
const raceExit = 66

// onlyDepRaces reports whether err is a contender's exit with the race
// detector's status and every race report in its stderr is a known
// dependency race; it returns the names of those races.
func onlyDepRaces(err error, stderr string) ([]string, bool) {
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != raceExit {
		return nil, false
	}
	const head = "WARNING: DATA RACE"
	parts := strings.Split(stderr, head)
	if len(parts) < 2 {
		return nil, false // no report to judge: a race of ours, cut from the buffer?
	}
	var names []string
	for _, report := range parts[1:] {
		if i := strings.Index(report, "=================="); i >= 0 {
			report = report[:i]
		}
		known := ""
		for _, r := range depRaces {
			all := true
			for _, f := range r.frames {
				all = all && strings.Contains(report, f)
			}
			if all {
				known = r.name
				break
			}
		}
		if known == "" {
			return nil, false
		}
		names = append(names, known)
	}
	return names, true
}
