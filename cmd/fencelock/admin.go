package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// lockJSON is one lock in the --json output of status and list.
type lockJSON struct {
	Key         string `json:"key"`
	Held        bool   `json:"held"`
	Owner       string `json:"owner,omitempty"`
	Token       uint64 `json:"token,omitempty"`
	RemainingMS int64  `json:"remaining_ms,omitempty"` // as the store judges it; 0: unknown (session-bound locks)
}

func toJSON(info fencelock.Info) lockJSON {
	return lockJSON{Key: info.Key, Held: info.Locked(), Owner: info.Owner, Token: uint64(info.Token), RemainingMS: info.Remaining.Milliseconds()}
}

func remaining(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}

const statusUsage = `
Usage: fencelock status [flags] KEY

Show who holds the lock KEY: owner, fencing token, and how long the lock
lives without a renewal (as the store judges it; "-" where the lock lives as
long as its holder's session, as on ZooKeeper).

Exit status: 0 if KEY is held, 1 if it is free, 64 usage error, 69 backend
cannot be reached.
`

const statusExamples = `Examples:
  fencelock status backup
  fencelock status --json --url redis://localhost:6379 jobs/nightly
  if fencelock status deploy/web >/dev/null; then echo "a deploy is running"; fi`

func cmdStatus(e *env, args []string) int {
	fset := e.flagSet("status", statusUsage, statusExamples)
	var cf connFlags
	addConnFlags(fset, &cf)
	asJSON := fset.Bool("json", false, "print JSON: {\"key\",\"held\",\"owner\",\"token\",\"remaining_ms\"}")
	pos, rest, exit, stop := e.parse(fset, args, 0)
	if stop {
		return exit
	}
	if len(pos) != 1 || len(rest) != 0 {
		return e.usageError("status", "want exactly one KEY")
	}
	key := pos[0]
	if err := driver.ValidateKey(key); err != nil {
		return e.usageError("status", "%v", err)
	}
	ctx := context.Background()
	cf.readOnly = true // reads create nothing, not even a file backend's directory
	c, err := e.open(ctx, &cf, nil, key)
	if err != nil {
		return e.fail("status", err, e.parsedURL(&cf))
	}
	defer c.Close()
	octx, cancel := context.WithTimeout(ctx, cf.connectTimeout)
	defer cancel()
	info, err := c.Inspect(octx, key)
	if err != nil {
		return e.fail("status", err, e.parsedURL(&cf))
	}
	if *asJSON {
		writeJSON(e.stdout, toJSON(info))
	} else if info.Locked() {
		fmt.Fprintf(e.stdout, "%s: held by %s, token %d, expires in %s\n", strconv.Quote(key), info.Owner, info.Token, remaining(info.Remaining))
	} else {
		fmt.Fprintf(e.stdout, "%s: free\n", strconv.Quote(key))
	}
	if !info.Locked() {
		return exitFree
	}
	return exitOK
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

const listUsage = `
Usage: fencelock list [flags] [PREFIX]

List every held lock whose key starts with PREFIX (all locks without one),
sorted by key, whoever holds them.
`

const listExamples = `Examples:
  fencelock list
  fencelock list jobs/
  fencelock list --json --url postgres://localhost/app | jq -r '.[].key'`

func cmdList(e *env, args []string) int {
	fset := e.flagSet("list", listUsage, listExamples)
	var cf connFlags
	addConnFlags(fset, &cf)
	asJSON := fset.Bool("json", false, "print a JSON array of {\"key\",\"held\",\"owner\",\"token\",\"remaining_ms\"}")
	pos, rest, exit, stop := e.parse(fset, args, 0)
	if stop {
		return exit
	}
	if len(pos) > 1 || len(rest) != 0 {
		return e.usageError("list", "want at most one PREFIX")
	}
	prefix := ""
	if len(pos) == 1 {
		prefix = pos[0]
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return e.usageError("list", "%v", err)
	}
	ctx := context.Background()
	probe := prefix
	if probe == "" {
		probe = "fencelock"
	}
	cf.readOnly = true // reads create nothing, not even a file backend's directory
	c, err := e.open(ctx, &cf, nil, probe)
	if err != nil {
		return e.fail("list", err, e.parsedURL(&cf))
	}
	defer c.Close()
	octx, cancel := context.WithTimeout(ctx, cf.connectTimeout)
	defer cancel()
	infos, err := c.List(octx, prefix)
	if err != nil {
		return e.fail("list", err, e.parsedURL(&cf))
	}
	if *asJSON {
		out := make([]lockJSON, 0, len(infos))
		for _, in := range infos {
			out = append(out, toJSON(in))
		}
		writeJSON(e.stdout, out)
		return exitOK
	}
	if len(infos) == 0 {
		fmt.Fprintln(e.stderr, "no locks held")
		return exitOK
	}
	tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tOWNER\tTOKEN\tEXPIRES IN")
	for _, in := range infos {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", in.Key, in.Owner, in.Token, remaining(in.Remaining))
	}
	tw.Flush()
	return exitOK
}

const releaseUsage = `
Usage: fencelock release --force [flags] KEY

Remove the lock KEY whoever holds it: an administrator's tool for a lock
whose holder is stuck. It prints what it removed. The holder learns of the
loss at its next renewal (a 'fencelock run' holder then stops its command
and exits 79). Fencing tokens stay monotonic: the next holder gets a higher
token, so the old holder's late writes can still be refused by the resource.

--force is required, to say that you mean to take the lock from its holder.

Exit status: 0 done (also when KEY was not locked), 64 usage error, 69 the
backend cannot be reached or cannot force-release.
`

const releaseExamples = `Examples:
  fencelock release --force backup
  fencelock release --force --url etcd://localhost:2379 jobs/nightly`

func cmdRelease(e *env, args []string) int {
	fset := e.flagSet("release", releaseUsage, releaseExamples)
	var cf connFlags
	addConnFlags(fset, &cf)
	force := fset.Bool("force", false, "required: remove the lock whoever holds it")
	cf.readOnly = true // nothing is locked in a file backend's missing directory: do not create it
	pos, rest, exit, stop := e.parse(fset, args, 0)
	if stop {
		return exit
	}
	if len(pos) != 1 || len(rest) != 0 {
		return e.usageError("release", "want exactly one KEY")
	}
	if !*force {
		return e.usageError("release", "release takes a lock away from its holder; say --force to do it (a holder releases its own lock by ending 'fencelock run')")
	}
	key := pos[0]
	if err := driver.ValidateKey(key); err != nil {
		return e.usageError("release", "%v", err)
	}
	ctx := context.Background()
	c, err := e.open(ctx, &cf, nil, key)
	if err != nil {
		return e.fail("release", err, e.parsedURL(&cf))
	}
	defer c.Close()
	octx, cancel := context.WithTimeout(ctx, cf.connectTimeout)
	defer cancel()
	info, err := c.ForceRelease(octx, key)
	if err != nil {
		return e.fail("release", err, e.parsedURL(&cf))
	}
	if !info.Locked() {
		fmt.Fprintf(e.stdout, "%s was not locked: nothing removed\n", strconv.Quote(key))
		return exitOK
	}
	fmt.Fprintf(e.stdout, "removed the lock on %s held by %s (token %d, %s left)\n", strconv.Quote(key), info.Owner, info.Token, remaining(info.Remaining))
	return exitOK
}

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is shown.
var version = ""

const versionUsage = `
Usage: fencelock version

Print fencelock's version, the Go version it was built with, and the URL
schemes of the backends linked into this binary.
`

func cmdVersion(e *env, args []string) int {
	fset := e.flagSet("version", versionUsage, "Example:\n  fencelock version")
	pos, rest, exit, stop := e.parse(fset, args, 0)
	if stop {
		return exit
	}
	if len(pos) != 0 || len(rest) != 0 {
		return e.usageError("version", "takes no arguments")
	}
	v := version
	rev := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " " + s.Value[:12]
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	fmt.Fprintf(e.stdout, "fencelock %s%s (%s, %s/%s)\nbackends: %s\n", v, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH, strings.Join(fencelock.Schemes(), ", "))
	return exitOK
}

const doctorUsage = `
Usage: fencelock doctor [flags]

Open the backend, check that it answers, and print what it guarantees (its
own description: fencing, clock, liveness, token scope, failover, loss
detection) and the warnings about its configuration that weaken exclusion
or fencing (Redis without appendfsync always, PostgreSQL with fsync off, a
standalone MongoDB, ...). The URL is shown redacted. Other commands show
these warnings only with --verbose.

With --require (or the URL's require=), doctor also measures each named
guarantee on the live server and prints the verdict: met or not, what it
observed, and the setting that would meet it (docs/deploying.md).

Exit status: 0 no warnings, 1 warnings, 78 a required guarantee is not
met, 64 usage error, 69 the backend cannot be reached.
`

const doctorExamples = `Examples:
  fencelock doctor --url redis://localhost:6379
  fencelock doctor --json --url postgres://db/app | jq -r '.warnings[]'
  fencelock doctor --require durable-tokens,failover --json --url redis://localhost:6379`

// doctorJSON is the --json output of doctor.
type doctorJSON struct {
	URL           string   `json:"url"`
	Backend       string   `json:"backend"`
	Fencing       string   `json:"fencing"`
	Clock         string   `json:"clock"`
	Liveness      string   `json:"liveness"`
	Scope         string   `json:"scope"`
	FailoverSafe  bool     `json:"failover_safe"`
	Failover      string   `json:"failover"`
	LossDetection string   `json:"loss_detection"`
	Warnings      []string `json:"warnings"`
	// Require is the verdict on each guarantee of --require and the
	// URL's require=, in order; RequireMet is true when all are met.
	// Both are absent when nothing is required.
	Require    []driver.GuaranteeResult `json:"require,omitempty"`
	RequireMet *bool                    `json:"require_met,omitempty"`
}

func cmdDoctor(e *env, args []string) int {
	fset := e.flagSet("doctor", doctorUsage, doctorExamples)
	var cf connFlags
	addConnFlags(fset, &cf)
	asJSON := fset.Bool("json", false, "print JSON: {\"url\",\"backend\",\"fencing\",...,\"warnings\"}")
	pos, rest, exit, stop := e.parse(fset, args, 0)
	if stop {
		return exit
	}
	if len(pos) != 0 || len(rest) != 0 {
		return e.usageError("doctor", "takes no arguments")
	}
	require, err := driver.ParseGuarantees("--require", cf.require)
	if err != nil {
		fmt.Fprintf(e.stderr, "fencelock doctor: %s\n", err)
		return exitUsage
	}
	cf.require = "" // judged below, not refused by Open
	raw, _ := e.rawURL(&cf)
	if u, err := url.Parse(raw); err == nil && u.Query().Has("require") {
		// The URL's require= too: doctor reports it rather than fail
		// to open.
		q := u.Query()
		inURL, err := driver.ParseGuarantees("URL parameter \"require\"", strings.Join(q["require"], ","))
		if err != nil {
			fmt.Fprintf(e.stderr, "fencelock doctor: %s\n", driver.RedactText(err.Error(), raw))
			return exitUsage
		}
		require = slices.Concat(inURL, require)
		q.Del("require")
		u.RawQuery = q.Encode()
		cf.url = u.String()
		raw = cf.url
	}
	if cf.verbose {
		// Client libraries' messages only: doctor prints the warnings
		// itself, once.
		setLibraryVerbose(true, raw, e.stderr)
		cf.verbose = false
	}
	cf.readOnly = true // reads create nothing, not even a file backend's directory
	c, err := e.open(context.Background(), &cf, nil, "fencelock")
	if err != nil {
		return e.fail("doctor", err, e.parsedURL(&cf))
	}
	defer c.Close()
	red := func(s string) string { return driver.RedactText(s, raw) }
	d := c.Describe()
	out := doctorJSON{
		URL: driver.RedactURL(raw), Backend: red(d.Name), Fencing: red(d.Fencing), Clock: red(d.Clock),
		Liveness: red(d.Liveness), Scope: d.Scope, FailoverSafe: d.FailoverSafe, Failover: red(d.Failover),
		LossDetection: red(d.LossDetection), Warnings: []string{},
	}
	for _, w := range d.Warnings {
		out.Warnings = append(out.Warnings, red(w))
	}
	if len(require) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), cf.connectTimeout)
		rs, err := driver.CheckGuarantees(ctx, c.Backend(), dedupeGuarantees(require))
		cancel()
		if err != nil {
			return e.fail("doctor", fmt.Errorf("measuring the required guarantees: %w", err), e.parsedURL(&cf))
		}
		met := true
		for _, r := range rs {
			r.Observed, r.Fix = red(r.Observed), red(r.Fix)
			out.Require = append(out.Require, r)
			met = met && r.Met
		}
		out.RequireMet = &met
	}
	if *asJSON {
		writeJSON(e.stdout, out)
	} else {
		tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "url:\t%s\n", out.URL)
		fmt.Fprintf(tw, "backend:\t%s\n", out.Backend)
		fmt.Fprintf(tw, "fencing:\t%s\n", out.Fencing)
		fmt.Fprintf(tw, "clock:\t%s\n", out.Clock)
		fmt.Fprintf(tw, "liveness:\t%s\n", out.Liveness)
		fmt.Fprintf(tw, "token scope:\t%s\n", out.Scope)
		fmt.Fprintf(tw, "failover safe:\t%v\n", out.FailoverSafe)
		if out.Failover != "" {
			fmt.Fprintf(tw, "failover:\t%s\n", out.Failover)
		}
		fmt.Fprintf(tw, "loss detection:\t%s\n", out.LossDetection)
		tw.Flush()
		if len(out.Warnings) == 0 {
			fmt.Fprintln(e.stdout, "warnings: none detected")
		} else {
			fmt.Fprintf(e.stdout, "warnings (%d):\n", len(out.Warnings))
			for _, w := range out.Warnings {
				fmt.Fprintf(e.stdout, "  - %s\n", w)
			}
		}
		if len(out.Require) > 0 {
			printVerdict(e.stdout, out.Require)
		}
	}
	if out.RequireMet != nil && !*out.RequireMet {
		return exitUnmet
	}
	if len(out.Warnings) > 0 {
		return exitWarnings
	}
	return exitOK
}

// printVerdict prints the verdict on the required guarantees as text.
func printVerdict(w io.Writer, rs []driver.GuaranteeResult) {
	fmt.Fprintln(w, "required guarantees:")
	for _, r := range rs {
		if r.Met {
			fmt.Fprintf(w, "  - %s: met (%s)\n", r.Guarantee, r.Observed)
			continue
		}
		fmt.Fprintf(w, "  - %s: NOT MET: %s; to meet it: %s\n", r.Guarantee, r.Observed, r.Fix)
	}
}

// dedupeGuarantees keeps the first of each guarantee, in order.
func dedupeGuarantees(gs []fencelock.Guarantee) []fencelock.Guarantee {
	var out []fencelock.Guarantee
	for _, g := range gs {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}
