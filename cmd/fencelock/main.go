// Command fencelock runs a command under a distributed lock, and inspects
// and administers locks, on any fencelock backend.
//
//	fencelock run [flags] KEY -- COMMAND [ARG...]
//	fencelock status [flags] KEY
//	fencelock list [flags] [PREFIX]
//	fencelock release --force [flags] KEY
//	fencelock migrate tokens --from URL --to URL [PREFIX]
//	fencelock migrate dual-url [--show-secrets] OLD-URL NEW-URL
//	fencelock doctor [flags]
//	fencelock safety --url URL [--url URL ...] [flags]
//	fencelock demo
//	fencelock version
//
// The backend is chosen by URL (--url, or the FENCELOCK_URL environment
// variable); without one, fencelock uses the embedded file backend, which
// needs no server and works across processes on one machine. See
// docs/cli.md for every flag, the exit statuses and examples.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// Exit statuses. They are documented in docs/cli.md and in `fencelock run
// --help`; keep the three in step.
const (
	exitOK          = 0
	exitFree        = 1  // status: the key is not locked
	exitWarnings    = 1  // doctor: the backend has configuration warnings
	exitUsage       = 64 // EX_USAGE: bad flags or arguments
	exitUnavailable = 69 // EX_UNAVAILABLE: backend cannot be opened or reached, or failed
	exitSoftware    = 70 // EX_SOFTWARE: internal error
	exitNotAcquired = 75 // EX_TEMPFAIL: the lock was not acquired (--no-wait, --timeout)
	exitUnmet       = 78 // EX_CONFIG: the backend does not meet a guarantee of --require
	exitLeaseLost   = 79 // the lease was lost while the command ran
	exitCannotExec  = 126
	exitNotFound    = 127
)

// env is the process environment the commands see, so tests can run them
// in-process.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

type command struct {
	name    string
	summary string
	run     func(e *env, args []string) int
}

var commands []command

func init() {
	commands = []command{
		{"run", "acquire a lock, run a command while holding it, release it", cmdRun},
		{"status", "show who holds a lock", cmdStatus},
		{"list", "list held locks (optionally under a prefix)", cmdList},
		{"release", "remove a lock whoever holds it (admin, needs --force)", cmdRelease},
		{"migrate", "move locks between backends: copy token floors, build a dual URL", cmdMigrate},
		{"doctor", "check a backend: what it guarantees and its configuration warnings", cmdDoctor},
		{"safety", "run the fault-injection safety suite against your own servers", cmdSafety},
		{"demo", "show fencing at work, in-process, on the memory backend", cmdDemo},
		{"version", "print the version and the linked backends", cmdVersion},
		{"help", "show help for a command", cmdHelp},
	}
}

func main() {
	safetyContender() // a contender process of `fencelock safety` never returns from it
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	os.Exit(e.main(os.Args[1:]))
}

func (e *env) main(args []string) int {
	if len(args) == 0 {
		e.usage(e.stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		e.usage(e.stdout)
		return exitOK
	case "-version", "--version":
		return cmdVersion(e, nil)
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(e, args[1:])
		}
	}
	if strings.HasPrefix(args[0], "-") {
		return e.flagsBeforeCommand(args)
	}
	return e.unknownCommand(args[0])
}

// flagsBeforeCommand reports flags written before the command
// ("fencelock --url URL status KEY"), naming the command if one follows,
// without repeating the arguments (a --url may carry a password).
func (e *env) flagsBeforeCommand(args []string) int {
	name := "COMMAND"
	for _, a := range args {
		if slices.ContainsFunc(commands, func(c command) bool { return c.name == a }) {
			name = a
			break
		}
	}
	fmt.Fprintf(e.stderr, "fencelock: flags go after the command: fencelock %s [flags] ...\nRun 'fencelock --help' for the list of commands.\n", name)
	return exitUsage
}

// unknownCommand reports a command that does not exist, naming the one
// probably meant, without the whole usage.
func (e *env) unknownCommand(name string) int {
	best, bestD := "", 3
	for _, c := range commands {
		if d := driver.EditDistance(strings.ToLower(name), c.name); d < bestD {
			best, bestD = c.name, d
		}
	}
	if best != "" && bestD*2 <= len(name) {
		fmt.Fprintf(e.stderr, "fencelock: unknown command %q; did you mean %q?\nRun 'fencelock --help' for the list of commands.\n", name, best)
	} else {
		fmt.Fprintf(e.stderr, "fencelock: unknown command %q\nRun 'fencelock --help' for the list of commands.\n", name)
	}
	return exitUsage
}

func (e *env) usage(w io.Writer) {
	fmt.Fprint(w, `fencelock runs a command under a distributed lock with a fencing token,
and inspects and administers locks.

Usage:
  fencelock COMMAND [flags] [arguments]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
The backend is chosen by URL: --url, or $FENCELOCK_URL. Without either,
fencelock uses the embedded file backend (`+defaultURLHelp+`):
no server needed, locks shared by every process on this machine.

Examples:
  fencelock run backup -- ./backup.sh
  fencelock run --no-wait --url redis://localhost:6379 jobs/nightly -- make nightly
  fencelock list --json
  fencelock demo

Run 'fencelock COMMAND --help' for a command's flags, examples and exit statuses.
`)
}

func cmdHelp(e *env, args []string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		e.usage(e.stdout)
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] && c.name != "help" {
			return c.run(e, []string{"--help"})
		}
	}
	return e.unknownCommand(args[0])
}

// flagSet returns a FlagSet for a subcommand whose help text is usage
// (printed before the flags) and examples (after).
func (e *env) flagSet(name, usage, examples string) *flag.FlagSet {
	fs := flag.NewFlagSet("fencelock "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "%s\n", strings.TrimSpace(usage))
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintf(w, "\nFlags:\n")
		}
		fs.VisitAll(func(f *flag.Flag) {
			typ, help := flag.UnquoteUsage(f)
			dash := "--"
			if typ != "" {
				typ = " " + typ
			}
			fmt.Fprintf(w, "  %s%s%s\n    \t%s", dash, f.Name, typ, strings.ReplaceAll(help, "\n", "\n    \t"))
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "true" && f.DefValue != "0s" {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(w)
		})
		if examples != "" {
			fmt.Fprintf(w, "\n%s\n", strings.TrimRight(examples, "\n"))
		}
	}
	return fs
}

// parse parses a subcommand's flags, allowing flags between positional
// arguments ("status KEY --json"). With stopAfter > 0 it stops after that
// many positional arguments and returns everything after them (or after a
// "--") as rest, unparsed: for run, that is the command and its own flags.
// With stopAfter 0 every argument before a "--" is parsed. When the
// caller should stop (help was shown, or a usage error), stop is true and
// exit is the status.
func (e *env) parse(fs *flag.FlagSet, args []string, stopAfter int) (pos, rest []string, exit int, stop bool) {
	unitDurations(fs)
	for {
		cut := len(args)
		for i, a := range args {
			if a == "--" {
				cut = i
				break
			}
		}
		if err := fs.Parse(args[:cut]); err != nil {
			name := strings.TrimPrefix(fs.Name(), "fencelock ")
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(e.stdout)
				fs.Usage()
				return nil, nil, exitOK, true
			}
			return nil, nil, e.usageError(name, "%s", flagError(fs, err)), true
		}
		left, tail := fs.Args(), args[cut:]
		if len(left) == 0 {
			if len(tail) > 0 {
				return pos, tail[1:], 0, false
			}
			return pos, nil, 0, false
		}
		pos = append(pos, left[0])
		args = append(append([]string{}, left[1:]...), tail...)
		if len(pos) == stopAfter {
			if len(args) > 0 && args[0] == "--" {
				return pos, args[1:], 0, false
			}
			if len(args) > 0 && len(args[0]) > 1 && args[0][0] == '-' {
				// Flags after the positional arguments ("run KEY --no-wait
				// -- COMMAND"): parsed as flags when a "--" ends them;
				// without one they would be taken for the command.
				name := strings.TrimPrefix(fs.Name(), "fencelock ")
				end := slices.Index(args, "--")
				if end < 0 {
					return nil, nil, e.usageError(name, "%s after %s looks like a flag: flags go before %s, or end them with --, as in fencelock %s [flags] %s [flags] -- COMMAND",
						args[0], pos[len(pos)-1], pos[len(pos)-1], name, pos[len(pos)-1]), true
				}
				if err := fs.Parse(args[:end]); err != nil {
					return nil, nil, e.usageError(name, "%s", flagError(fs, err)), true
				}
				if fs.NArg() > 0 {
					return nil, nil, e.usageError(name, "unexpected %q among the flags after %s: the command goes after --", fs.Arg(0), pos[len(pos)-1]), true
				}
				return pos, args[end+1:], 0, false
			}
			return pos, args, 0, false
		}
	}
}

// flagError is the message of a flag parsing error, written with the
// flag as the user typed it (--timeout, not -timeout): a value a flag's own
// parser refused with an *InvalidOptionError reads as that error alone
// ("invalid --ttl "5": ... did you mean 5s?"), not wrapped in the flag
// package's "invalid value ... for flag -ttl: fencelock: ..."; a number
// that does not parse says so rather than "parse error"; an unknown flag
// names the one probably meant.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if i := strings.Index(msg, ": fencelock: invalid "); i >= 0 && strings.HasPrefix(msg, "invalid value ") {
		return msg[i+len(": fencelock: "):]
	}
	var value, name string
	if n, _ := fmt.Sscanf(msg, "invalid value %q for flag -%s", &value, &name); n == 2 {
		name = strings.TrimSuffix(name, ":")
		switch {
		case strings.HasSuffix(msg, ": parse error"):
			return fmt.Sprintf("invalid --%s %q: not a whole number", name, value)
		case strings.HasSuffix(msg, ": value out of range"):
			return fmt.Sprintf("invalid --%s %q: out of range", name, value)
		}
	}
	if n, _ := fmt.Sscanf(msg, "invalid boolean value %q for -%s", &value, &name); n == 2 {
		return fmt.Sprintf("invalid --%s %q: want true or false (or leave the value out)", strings.TrimSuffix(name, ":"), value)
	}
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimLeft(name, "-")
		best, bestD := "", 3
		fs.VisitAll(func(f *flag.Flag) {
			if d := driver.EditDistance(strings.ToLower(name), f.Name); d < bestD || d == bestD && f.Name < best {
				best, bestD = f.Name, d
			}
		})
		if best != "" && bestD*2 <= len(name) {
			return fmt.Sprintf("unknown flag --%s; did you mean --%s?", name, best)
		}
		return fmt.Sprintf("unknown flag --%s", name)
	}
	return strings.Replace(msg, " -", " --", 1)
}

// unitDuration wraps a duration flag so that its value parses with
// driver.ParseDuration: "--timeout 5" is answered "it needs a unit; did
// you mean 5s?", as --ttl is, instead of the flag package's "parse error".
type unitDuration struct {
	name string
	orig flag.Value // the flag package's own, which sets the variable
}

func (v *unitDuration) String() string { return v.orig.String() }

func (v *unitDuration) Set(s string) error {
	d, err := driver.ParseDuration("--"+v.name, s)
	if err != nil {
		return err
	}
	return v.orig.Set(d.String())
}

func (v *unitDuration) Get() any { return v.orig.(flag.Getter).Get() }

// unitDurations makes every time.Duration flag of fs a unitDuration.
func unitDurations(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			if _, isDur := g.Get().(time.Duration); isDur {
				f.Value = &unitDuration{name: f.Name, orig: f.Value}
			}
		}
	})
}

func (e *env) usageError(cmd, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "fencelock %s: %s\nRun 'fencelock %s --help' for usage.\n", cmd, fmt.Sprintf(format, args...), cmd)
	return exitUsage
}
