package suite_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/fencelock/fencelock/safety/report"
	"github.com/fencelock/fencelock/safety/suite"
)

// A team's own safety test: its store under every default fault, with
// shell commands that kill and restart the server, three rounds per fault,
// a rule of its own, and a bound on the time. The binary must call
// suite.MainIfContender first (in TestMain or main).
func ExampleRun() {
	url := os.Getenv("OURSTORE_URL") // a registered scheme: the binary links the driver
	rep, err := suite.Run(context.Background(), suite.Config{
		Backends: []suite.Backend{{
			Name: "ourstore", URL: url,
			Control: suite.Commands{
				Kill:    "systemctl kill -s KILL ourstore",
				Restart: "systemctl start ourstore",
			}.Control(url),
		}},
		Rounds:  3,
		OutDir:  "safety-report",
		Timeout: 20 * time.Minute,
		Expect: report.Table{{Backend: "ourstore", Fault: suite.FaultServerPause,
			Expectation: report.Expectation{Tolerate: []string{"P6"}, Why: "after a pause ourstore needs 30s to serve again"}}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if rep.Failed() {
		fmt.Printf("seed %d: %v\n", rep.Seed, rep.Problems())
	}
}
