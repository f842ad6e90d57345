//go:build unix

package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// What a newcomer types in the first hour, and what the command must
// answer: the documented exit status, and one line on what to do next,
// without the password.

const firstHourSecret = "S3cr3tA"

// checkOneLineUsage runs fencelock in-process and checks the exit status,
// that the message contains each of want, that it is one line (plus the
// "Run 'fencelock ... --help'" pointer), and that it holds no password.
func checkOneLineUsage(t *testing.T, code int, args []string, want ...string) {
	t.Helper()
	out, got := inProcess(args...)
	if got != code {
		t.Errorf("fencelock %q: exit %d, want %d:\n%s", args, got, code, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("fencelock %q: %q; want it to contain %q", args, out, w)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) > 1 && strings.HasPrefix(lines[len(lines)-1], "Run 'fencelock") {
		lines = lines[:len(lines)-1]
	}
	if len(lines) != 1 {
		t.Errorf("fencelock %q printed %d lines; want one:\n%s", args, len(lines), out)
	}
	if strings.Contains(out, firstHourSecret) {
		t.Errorf("fencelock %q printed the password: %q", args, out)
	}
}

// TestDurationFlagWithoutUnitSuggestsOne checks that every duration flag,
// not only --ttl, answers a bare number with the unit it lacks, and
// names the flag as it is typed (--timeout), instead of the flag
// package's "invalid value "5" for flag -timeout: parse error".
func TestDurationFlagWithoutUnitSuggestsOne(t *testing.T) {
	dir := t.TempDir()
	u := "file://" + dir
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--url", u, "--timeout", "5", "k", "--", "true"}, `invalid --timeout "5": not a duration: it needs a unit; did you mean 5s?`},
		{[]string{"run", "--url", u, "--grace", "2", "k", "--", "true"}, `invalid --grace "2": not a duration: it needs a unit; did you mean 2s?`},
		{[]string{"run", "--url", u, "--min-hold", "60", "k", "--", "true"}, "did you mean 60s?"},
		{[]string{"status", "--url", u, "--connect-timeout", "5", "k"}, `invalid --connect-timeout "5"`},
		{[]string{"list", "--url", u, "--connect-timeout=3"}, "did you mean 3s?"},
		{[]string{"run", "--url", u, "--timeout", "5x", "k", "--", "true"}, `invalid --timeout "5x": not a duration (e.g. 1500ms, 15s)`},
	} {
		checkOneLineUsage(t, exitUsage, c.args, c.want)
		out, _ := inProcess(c.args...)
		if strings.Contains(out, "parse error") || strings.Contains(out, "flag -") {
			t.Errorf("fencelock %q: %q shows the flag package's message", c.args, out)
		}
	}
}

// TestTimeoutZeroIsRefused checks that --timeout 0, which flock(1) users
// read as "do not wait" (flock -w 0) and which meant "wait forever", is
// a usage error that names both intents' flags.
func TestTimeoutZeroIsRefused(t *testing.T) {
	u := "file://" + t.TempDir()
	checkOneLineUsage(t, exitUsage, []string{"run", "--url", u, "--timeout", "0", "k", "--", "true"}, "--no-wait", "leave --timeout out")
	checkOneLineUsage(t, exitUsage, []string{"run", "--url", u, "--timeout=0s", "k", "--", "true"}, "--no-wait")
	if out, code := inProcess("run", "--url", u, "--timeout", "1s", "k", "--", "true"); code != 0 {
		t.Errorf("run --timeout 1s on a free key: exit %d:\n%s", code, out)
	}
}

// TestMistypedFlagNamesTheFlagMeant checks that an unknown flag gets the
// one probably meant, written with two dashes as the docs write flags.
func TestMistypedFlagNamesTheFlagMeant(t *testing.T) {
	u := "file://" + t.TempDir()
	checkOneLineUsage(t, exitUsage, []string{"run", "--url", u, "--timout", "5s", "k", "--", "true"}, "unknown flag --timout; did you mean --timeout?")
	checkOneLineUsage(t, exitUsage, []string{"run", "--url", u, "--nowait", "k", "--", "true"}, "did you mean --no-wait?")
	checkOneLineUsage(t, exitUsage, []string{"list", "--url", u, "--jsn"}, "did you mean --json?")
	checkOneLineUsage(t, exitUsage, []string{"status", "--urll", u, "k"}, "did you mean --url?")
	checkOneLineUsage(t, exitUsage, []string{"run", "--url", u, "--permits", "x", "k", "--", "true"}, `invalid --permits "x": not a whole number`)
	checkOneLineUsage(t, exitUsage, []string{"run", "--url", u, "--no-wait=maybe", "k", "--", "true"}, `invalid --no-wait "maybe": want true or false`)
}

// TestFlagsBeforeTheCommandSayWhereTheyGo checks that "fencelock --url
// URL status KEY" is told that flags follow the command, without echoing
// the URL, which may carry a password.
func TestFlagsBeforeTheCommandSayWhereTheyGo(t *testing.T) {
	checkOneLineUsage(t, exitUsage, []string{"--url", "redis://:" + firstHourSecret + "@h:6379/0", "status", "k"}, "flags go after the command: fencelock status")
	checkOneLineUsage(t, exitUsage, []string{"--ttl", "5s"}, "flags go after the command")
}

// TestHelpHelpShowsUsage checks that "fencelock help help" and "fencelock
// help --help" show the usage, with status 0, rather than "unknown
// command".
func TestHelpHelpShowsUsage(t *testing.T) {
	for _, args := range [][]string{{"help", "help"}, {"help", "--help"}, {"help", "-h"}} {
		out, code := inProcess(args...)
		if code != exitOK || !strings.Contains(out, "Commands:") {
			t.Errorf("fencelock %q: exit %d:\n%s", args, code, out)
		}
	}
}

// TestReleaseOnMissingFileDirCreatesNothing checks that release --force,
// pointed at a file backend directory that does not exist (a typo), says
// so and creates nothing, as status and list do.
func TestReleaseOnMissingFileDirCreatesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "absent")
	out, code := inProcess("release", "--force", "--url", "file://"+dir, "k")
	if code != exitUnavailable || !strings.Contains(out, "no such directory") {
		t.Errorf("release --force on a missing directory: exit %d:\n%s", code, out)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("release --force created the directory: stat = %v", err)
	}
}

// TestURLTyposGetOneLineWithTheFix checks the URLs newcomers type wrong,
// through the command: each is a usage error (64) in one line that says
// what to write, with no password and no list of every scheme.
func TestURLTyposGetOneLineWithTheFix(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"localhost:6379", "did you mean redis://localhost:6379?"},
		{"app:" + firstHourSecret + "@db:5432/app", "did you mean postgres://app:xxxxx@db:5432/app?"},
		{"127.0.0.1:25070", "has no scheme"},
		{"redis:/127.0.0.1:6379/0", "did you mean redis://127.0.0.1:6379/0?"},
		{"postgres://app:" + firstHourSecret + "/x@db/app", "percent-encode"},
		{`"redis://127.0.0.1:6379/0"`, "quotes"},
		{"mongodb://127.0.0.1:1/db?tll=5s", "did you mean ttl?"},
	} {
		args := []string{"status", "--url", c.url, "k"}
		checkOneLineUsage(t, exitUsage, args, c.want)
		if out, _ := inProcess(args...); strings.Contains(out, "rediss+sentinel") {
			t.Errorf("fencelock %q lists every scheme: %q", args, out)
		}
	}
}

// TestPostgresParameterTypoGuessesTheEngineParameter checks, against the
// real server, that a misspelt engine parameter that PostgreSQL itself
// refuses ("unrecognized configuration parameter") is answered "did you
// mean ttl?".
func TestPostgresParameterTypoGuessesTheEngineParameter(t *testing.T) {
	raw := os.Getenv("FENCELOCK_TEST_POSTGRES")
	if raw == "" {
		t.Skip("FENCELOCK_TEST_POSTGRES not set")
	}
	sep := "?"
	if strings.Contains(raw, "?") {
		sep = "&"
	}
	checkOneLineUsage(t, exitUsage, []string{"status", "--url", raw + sep + "tll=5s", "k"}, "did you mean ttl?")
}

// TestUnreachableStoreIsOneLineWithWhatToCheck checks that a store that
// refuses the connection is reported in one line (pgx's message lists
// every address tried, on lines of its own) that says what to check.
func TestUnreachableStoreIsOneLineWithWhatToCheck(t *testing.T) {
	for _, raw := range []string{
		"postgres://app:" + firstHourSecret + "@127.0.0.1:1/app",
		"redis://:" + firstHourSecret + "@127.0.0.1:1/0",
	} {
		args := []string{"status", "--connect-timeout", "5s", "--url", raw, "k"}
		checkOneLineUsage(t, exitUnavailable, args, "127.0.0.1:1", "check that the server runs at 127.0.0.1:1")
	}
}

// TestSafetyBadURLIsUsageAndWritesNoReport checks that `fencelock safety`
// with a URL no backend can use exits 64 (docs/cli.md: a bad URL is a
// usage error on every command) before writing a report directory; it
// exited 69 with a report of a cell that was "not run".
func TestSafetyBadURLIsUsageAndWritesNoReport(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("fencelock safety runs on Linux")
	}
	for _, c := range []struct{ url, want string }{
		{"nosuch://h", `unknown URL scheme "nosuch"`},
		{"localhost:6379", "did you mean redis://localhost:6379?"},
		{"redis://:" + firstHourSecret + "@127.0.0.1:1/0?tll=1s", "did you mean ttl?"},
	} {
		out := filepath.Join(t.TempDir(), "report")
		checkOneLineUsage(t, exitUsage, []string{"safety", "--url", c.url, "--out", out}, c.want)
		if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("safety --url %s wrote a report: stat = %v", c.url, err)
		}
	}
}
