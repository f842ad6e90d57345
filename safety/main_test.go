package safety

import (
	"flag"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/safety/suite"
)

var (
	flagSeed   = flag.Int64("safety.seed", 0, "seed of the run (0: random); every run prints its seed")
	flagReport = flag.String("safety.report", "", "write the markdown report to this path (e.g. ../docs/safety.md)")
	flagJSON   = flag.String("safety.json", "", "write the JSON report to this path (e.g. ../docs/safety.json)")
	flagSoak   = flag.Bool("safety.soak", false, "run the soak profile: more rounds per fault and a longer baseline")
	flagCell   = flag.Duration("safety.celltimeout", 0, "bound each cell by this (0: the profile's, 5m quick, 30m soak); a soak of a failover cell, 4-25 s a round, needs more")
)

// TestMain runs the contender program instead of the tests when the
// process is a contender started by the harness (the suite re-executes
// this test binary with the contender's configuration in its
// environment).
func TestMain(m *testing.M) {
	suite.MainIfContender()
	goleak.VerifyTestMain(m)
}
