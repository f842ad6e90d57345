package safety

import (
	"context"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/fencelock/fencelock/safety/report"
	"github.com/fencelock/fencelock/safety/suite"
)

// TestLockDelayUnfenced runs the lock-delay cell (suite.FaultLockDelay) on
// PostgreSQL and Redis: with fencing off on the resource and a lock delay
// longer than a holder's pause, the paused holder's late write lands
// before the next holder's first, so P1 holds where the fencing-off
// control (the same pause without a delay, in TestSafety) fails it.
func TestLockDelayUnfenced(t *testing.T) {
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Int64N(1<<53) + 1
	}
	ran := false
	for _, def := range backendDefs[:2] { // postgres, redis
		url := os.Getenv(def.envVar)
		if url == "" {
			continue
		}
		ran = true
		t.Run(def.name, func(t *testing.T) {
			cfg := suite.Config{
				Backends:      []suite.Backend{{Name: def.name, URL: url, TTL: def.ttl, Slack: def.slack}},
				Faults:        []string{suite.FaultLockDelay},
				Rounds:        2,
				ControlRounds: 2,
				Seed:          seed,
				Timeout:       2 * time.Minute,
				Logf:          t.Logf,
			}
			cfg.Cell = func(_, fault string, run func() suite.CellRun) {
				r := run()
				t.Log(r.Summary)
				if r.Err != nil {
					t.Fatalf("%s: %v (seed %d)", fault, r.Err, seed)
				}
				if p := r.Cell.Problem(); p != "" {
					t.Errorf("%s: %s (seed %d)\nhistory: %s", fault, p, seed, r.History)
				}
				if r.Cell.Verdict != report.Safe {
					t.Errorf("%s: verdict %s, want %s (seed %d): %s", fault, r.Cell.Verdict, report.Safe, seed, r.Cell.Setup)
				}
				t.Logf("%s: %s", fault, r.Cell.Setup)
			}
			rep, err := suite.Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Cells) != 1 {
				t.Fatalf("%d cells ran, want the lock-delay cell; not run: %+v", len(rep.Cells), rep.NotRun)
			}
		})
	}
	if !ran {
		t.Skip("neither FENCELOCK_TEST_POSTGRES nor FENCELOCK_TEST_REDIS is set")
	}
}
