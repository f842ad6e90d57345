package main

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/migrate"
)

const migrateUsage = `
Usage: fencelock migrate tokens --from URL --to URL [flags] [PREFIX]
       fencelock migrate dual-url OLD-URL NEW-URL

tokens: raise the token floor of the backend at --to above every fencing
token the backend at --from has issued (for keys starting with PREFIX, all
without one), so that no token the new backend issues is at or below one a
downstream service has already seen. Where --to has a store-wide floor
(PostgreSQL, etcd, ZooKeeper) it is raised to --from's highest token;
otherwise (Redis, MongoDB, file) each key --from lists gets its own
floor. Floors never go down: the command is
idempotent, safe to re-run, and safe while locks are held on either side.
Run it before phase 2 and again right before phase 3 of a migration, and
from new to old before rolling back from phase 2 to phase 1
(docs/migration.md).

dual-url: print the URL of the dual backend that holds every lock on OLD
and on NEW (phase 2 of a migration), for FENCELOCK_URL or --url. If OLD or
NEW carries a credential (a password, a password= parameter, ...), the
URL is printed only with --show-secrets; without it, the command shows the
URL redacted on stderr and exits 64, so that no secret is printed by
accident.

Exit status: 0 done, 64 usage error, 69 a backend cannot be reached or has
no token floor.
`

const migrateExamples = `Examples:
  fencelock migrate tokens --dry-run --from redis://cache:6379 --to postgres://db/app
  fencelock migrate tokens --from redis://cache:6379 --to postgres://db/app
  export FENCELOCK_URL=$(fencelock migrate dual-url redis://cache:6379 postgres://db/app)
  export FENCELOCK_URL=$(fencelock migrate dual-url --show-secrets redis://:PW@cache:6379 postgres://db/app)`

func cmdMigrate(e *env, args []string) int {
	fset := e.flagSet("migrate", migrateUsage, migrateExamples)
	var from, to connFlags
	fset.StringVar(&from.url, "from", "", "the old backend's `URL` (tokens)")
	fset.StringVar(&to.url, "to", "", "the new backend's `URL` (tokens)")
	fset.DurationVar(&from.connectTimeout, "connect-timeout", 10*time.Second, "give up if a backend cannot be reached within `D`")
	fset.BoolVar(&from.verbose, "verbose", false, "log the lock engine's warnings and events to stderr")
	dry := fset.Bool("dry-run", false, "tokens: show the high-water marks and what would be raised; change nothing")
	asJSON := fset.Bool("json", false, "tokens: print the result as JSON")
	showSecrets := fset.Bool("show-secrets", false, "dual-url: print the URL even if it carries credentials")
	pos, rest, exit, stop := e.parse(fset, args, 0)
	if stop {
		return exit
	}
	if len(pos) == 0 || len(rest) != 0 {
		return e.usageError("migrate", "want a subcommand: tokens or dual-url")
	}
	switch pos[0] {
	case "dual-url":
		if len(pos) != 3 {
			return e.usageError("migrate", "dual-url wants OLD-URL NEW-URL")
		}
		for _, u := range pos[1:] {
			if _, err := url.Parse(u); err != nil {
				return e.usageError("migrate", "dual-url: %s is not a URL", driver.RedactURL(u))
			}
		}
		d := migrate.DualURL(pos[1], pos[2])
		if red := driver.RedactURL(d); red != d && !*showSecrets {
			return e.usageError("migrate", "dual-url: OLD-URL or NEW-URL carries a credential, so the dual URL is not printed: %s\n"+
				"Pass --show-secrets to print it with its credentials (e.g. export FENCELOCK_URL=$(fencelock migrate dual-url --show-secrets ...))", red)
		}
		fmt.Fprintln(e.stdout, d)
		return exitOK
	case "tokens":
	default:
		return e.usageError("migrate", "unknown subcommand %q: want tokens or dual-url", pos[0])
	}
	if len(pos) > 2 {
		return e.usageError("migrate", "tokens wants at most one PREFIX")
	}
	prefix := ""
	if len(pos) == 2 {
		prefix = pos[1]
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return e.usageError("migrate", "%v", err)
	}
	if from.url == "" || to.url == "" {
		return e.usageError("migrate", "tokens needs both --from and --to")
	}
	if from.url == to.url {
		return e.usageError("migrate", "--from and --to name the same backend")
	}
	to.connectTimeout, to.verbose = from.connectTimeout, from.verbose
	ctx := context.Background()
	src, err := e.open(ctx, &from, nil, "fencelock")
	if err != nil {
		return e.fail("migrate", err, e.parsedURL(&from))
	}
	defer src.Close()
	dst, err := e.open(ctx, &to, nil, "fencelock")
	if err != nil {
		return e.fail("migrate", err, e.parsedURL(&to))
	}
	defer dst.Close()
	octx, cancel := context.WithTimeout(ctx, 10*from.connectTimeout)
	defer cancel()

	if *dry {
		return e.migrateDryRun(octx, src.Backend(), dst.Backend(), prefix, *asJSON, &from)
	}
	rep, err := migrate.CopyTokens(octx, src.Backend(), dst.Backend(), prefix)
	if err != nil {
		return e.fail("migrate", err, nil)
	}
	if *asJSON {
		writeJSON(e.stdout, reportJSON(rep))
	} else {
		switch {
		case rep.Max == 0:
			fmt.Fprintln(e.stdout, "the old backend has issued no tokens: nothing to raise")
		case rep.Global:
			fmt.Fprintf(e.stdout, "raised the new backend's global token floor to %d (the old backend's highest token; %d keys listed)\n", rep.Max, rep.Keys)
		default:
			fmt.Fprintf(e.stdout, "raised the token floor of %d keys on the new backend (highest %d)\n", rep.Raised, rep.Max)
		}
		for _, w := range rep.Warnings {
			fmt.Fprintf(e.stderr, "fencelock migrate: warning: %s\n", w)
		}
	}
	return exitOK
}

type tokensJSON struct {
	Keys     int      `json:"keys"`
	Max      uint64   `json:"max"`
	Global   bool     `json:"global"`
	Raised   int      `json:"raised"`
	Warnings []string `json:"warnings,omitempty"`
	DryRun   bool     `json:"dry_run,omitempty"`
}

func reportJSON(r migrate.TokenReport) tokensJSON {
	return tokensJSON{Keys: r.Keys, Max: uint64(r.Max), Global: r.Global, Raised: r.Raised, Warnings: r.Warnings}
}

// migrateDryRun prints both sides' marks and changes nothing.
func (e *env) migrateDryRun(ctx context.Context, src, dst driver.Backend, prefix string, asJSON bool, from *connFlags) int {
	var hws [2]driver.HighWater
	for i, b := range []driver.Backend{src, dst} {
		f, ok := b.(driver.TokenFloorer)
		if !ok {
			return e.fail("migrate", fmt.Errorf("%w (%s side)", migrate.ErrNoFloor, [2]string{"--from", "--to"}[i]), nil)
		}
		hw, err := f.HighWater(ctx, prefix)
		if err != nil {
			return e.fail("migrate", err, e.parsedURL(from))
		}
		hws[i] = hw
	}
	if asJSON {
		writeJSON(e.stdout, tokensJSON{Keys: len(hws[0].Keys), Max: uint64(hws[0].Max()), DryRun: true})
		return exitOK
	}
	keys := make([]string, 0, len(hws[0].Keys))
	for k := range hws[0].Keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(e.stdout, "old backend: %d keys, highest token %d; new backend: highest token %d\n", len(keys), hws[0].Max(), hws[1].Max())
	for _, k := range keys {
		fmt.Fprintf(e.stdout, "  %s\told %d\tnew %d\n", strconv.Quote(k), hws[0].Keys[k], max(hws[1].Keys[k], hws[1].Global))
	}
	fmt.Fprintln(e.stdout, "dry run: nothing changed")
	return exitOK
}
