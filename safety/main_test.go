package safety

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/safety/contender"
)

var (
	flagSeed   = flag.Int64("safety.seed", 0, "seed of the run (0: random); every run prints its seed")
	flagReport = flag.String("safety.report", "", "write the markdown report to this path (e.g. ../docs/safety.md)")
	flagJSON   = flag.String("safety.json", "", "write the JSON report to this path (e.g. ../docs/safety.json)")
	flagSoak   = flag.Bool("safety.soak", false, "run the soak profile: more rounds per fault and a longer baseline")
)

// TestMain runs the contender program instead of the tests when the
// process is a contender started by the harness (safety/proc re-executes
// this test binary with the contender's configuration in its
// environment).
func TestMain(m *testing.M) {
	if cfg, ok, err := contender.FromEnv(); ok {
		if err == nil {
			err = contender.Main(cfg, os.Stdin, os.Stdout)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "contender %s: %v\n", cfg.Proc, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
