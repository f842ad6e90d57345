// Command soakmerge merges the JSON reports of a safety soak run in
// shards (docs/safety-soak.md) into one report, markdown and JSON.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/fencelock/fencelock/safety/report"
	"github.com/fencelock/fencelock/safety/suite"
)

// soakmerge OUT.md OUT.json IN.json... writes one report of several
// shards' cells: a soak split by cell over processes (each on a server
// of its own where its cells kill or pause the server) is one soak. A
// cell that several shards ran (a long cell split by rounds over
// clusters of its own) becomes one cell with the shards' rounds summed.
func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: soakmerge OUT.md OUT.json SHARD.json...")
		os.Exit(2)
	}
	var out report.Report
	var longest time.Duration
	var profiles []string
	for i, p := range os.Args[3:] {
		b, err := os.ReadFile(p)
		if err != nil {
			fatal(err)
		}
		var r report.Report
		if err := json.Unmarshal(b, &r); err != nil {
			fatal(fmt.Errorf("%s: %w", p, err))
		}
		if i == 0 {
			out = r
			out.Cells, out.NotRun = nil, nil
			out.Env = map[string]string{}
		}
		for k, v := range r.Env {
			out.Env[k] = v
		}
		out.Env[fmt.Sprintf("shard %d seed", i+1)] = fmt.Sprint(r.Seed)
		profiles = append(profiles, r.Profile)
		out.Cells = append(out.Cells, r.Cells...)
		out.NotRun = append(out.NotRun, r.NotRun...)
		if r.Started.Before(out.Started) {
			out.Started = r.Started
		}
		longest = max(longest, r.Duration)
	}
	out.Duration = longest
	out.Profile = shardProfile(profiles)
	out.Cells = mergeCells(out.Cells)
	out.NotRun = stillNotRun(out.NotRun, out.Cells)
	if err := suite.WriteReport(os.Args[1], os.Args[2], out); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "soakmerge:", err)
	os.Exit(1)
}
