package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// defaultURL is the backend used without --url or FENCELOCK_URL: the
// embedded file backend in its default directory.
const defaultURL = "file://"

const defaultURLHelp = "file://, a directory private to your user"

// connFlags are the flags every command that talks to a backend shares.
type connFlags struct {
	url            string
	connectTimeout time.Duration
	verbose        bool
	readOnly       bool   // the command only reads: it must create nothing
	require        string // --require: comma-separated guarantees (driver.AllGuarantees)
}

func addConnFlags(fs *flag.FlagSet, cf *connFlags) {
	fs.StringVar(&cf.url, "url", "", "backend `URL`, e.g. postgres://host/db, redis://host:6379, etcd://host:2379,\nzk://host:2181, mongodb://host/db, file:///dir (default $FENCELOCK_URL, else "+defaultURL+")")
	fs.DurationVar(&cf.connectTimeout, "connect-timeout", 10*time.Second, "give up if the backend cannot be reached within `D`")
	fs.StringVar(&cf.require, "require", "", "refuse a backend that does not meet these `GUARANTEES` (comma-separated: "+guaranteeNames()+"),\nmeasured on the live server; same as the URL's require= (see docs/deploying.md)")
	fs.BoolVar(&cf.verbose, "verbose", false, "log the lock engine's events, the client libraries' messages and the backend's\nconfiguration warnings to stderr")
}

// backendError is a failure to open or reach a backend.
type backendError struct {
	msg   string
	bad   bool // a bad URL or option (usage) rather than an unreachable store
	unmet bool // the store does not meet a required guarantee
}

func (e *backendError) Error() string { return e.msg }

func (e *backendError) status() int {
	if e.unmet {
		return exitUnmet
	}
	if e.bad {
		return exitUsage
	}
	return exitUnavailable
}

// rawURL returns the URL to use and where it came from.
func (e *env) rawURL(cf *connFlags) (string, string) {
	switch {
	case cf.url != "":
		return cf.url, "--url"
	case e.getenv("FENCELOCK_URL") != "":
		return e.getenv("FENCELOCK_URL"), "$FENCELOCK_URL"
	}
	return defaultURL, "default"
}

// open opens a client on the chosen backend and checks, within the connect
// timeout, that the store answers (Inspect of probeKey), so that a wrong
// address fails fast with the address and the timeout named instead of
// waiting forever. Errors never contain a credential from the URL
// (driver.RedactText). With --verbose, the backend's configuration
// warnings (Describe) are printed once, to stderr; without it, nothing is
// logged.
func (e *env) open(ctx context.Context, cf *connFlags, opts *fencelock.Options, probeKey string) (*fencelock.Client, error) {
	raw, from := e.rawURL(cf)
	u, perr := url.Parse(raw)
	if opts == nil {
		opts = &fencelock.Options{}
	}
	if cf.verbose {
		setLibraryVerbose(true, raw, e.stderr)
		level := slog.LevelDebug
		opts.Logger = slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))
	}
	if cf.connectTimeout <= 0 {
		return nil, &backendError{msg: "--connect-timeout must be positive", bad: true}
	}
	if cf.require != "" {
		gs, err := driver.ParseGuarantees("--require", cf.require)
		if err != nil {
			return nil, &backendError{msg: err.Error(), bad: true}
		}
		opts.Require = append(opts.Require, gs...)
	}
	if cf.readOnly && perr == nil && strings.EqualFold(u.Scheme, "file") && (u.Host == "" || u.Host == "localhost") {
		// The file backend creates its directory on open; a command that
		// only reads must not, and nothing can be locked in a directory
		// that does not exist.
		dir := u.Path
		if dir == "" {
			dir = u.Opaque
		}
		if _, err := os.Stat(dir); dir != "" && errors.Is(err, fs.ErrNotExist) {
			return nil, &backendError{msg: fmt.Sprintf("%s: no such directory, so nothing is locked there (fencelock run creates it)", driver.RedactURL(raw))}
		}
	}
	octx, cancel := context.WithTimeout(ctx, cf.connectTimeout)
	defer cancel()
	type result struct {
		c   *fencelock.Client
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := fencelock.Open(octx, raw, opts)
		if err == nil {
			if _, err = c.Inspect(octx, probeKey); err != nil {
				c.Close()
				c = nil
			}
		}
		done <- result{c, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		r.err = ctx.Err()
	case <-time.After(cf.connectTimeout + 2*time.Second):
		// A client library that does not honour its context: leave it
		// behind (the process is about to exit) rather than hang.
		r.err = context.DeadlineExceeded
	}
	c, err := r.c, r.err
	if err == nil {
		if cf.verbose {
			d := c.Describe()
			for _, w := range d.Warnings {
				fmt.Fprintf(e.stderr, "fencelock: warning: %s backend: %s\n", d.Name, driver.RedactText(w, raw))
			}
		}
		return c, nil
	}
	msg := oneLine(driver.RedactText(err.Error(), raw))
	var ioe *fencelock.InvalidOptionError
	switch {
	case perr != nil:
		return nil, &backendError{msg: fmt.Sprintf("backend URL from %s: %s", from, msg), bad: true}
	case errors.Is(err, fencelock.ErrUnknownScheme), errors.As(err, &ioe) && strings.HasPrefix(ioe.Option, "URL"):
		return nil, &backendError{msg: fmt.Sprintf("backend URL from %s: %s", from, msg), bad: true}
	case errors.Is(err, fencelock.ErrInvalidOption), errors.Is(err, fencelock.ErrInvalidKey):
		return nil, &backendError{msg: msg, bad: true}
	case errors.Is(err, fencelock.ErrGuaranteeUnmet):
		return nil, &backendError{msg: msg, unmet: true}
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	where := driver.RedactText(u.Host, raw)
	if where == "" {
		where = driver.RedactURL(raw)
	}
	if octx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return nil, &backendError{msg: fmt.Sprintf("cannot reach the %s backend at %s within %v (--connect-timeout): %s", u.Scheme, where, cf.connectTimeout, msg)}
	}
	if refused(err) && !strings.Contains(msg, "check that") {
		msg += fmt.Sprintf("; check that the server runs at %s and that the URL (from %s) is right", where, from)
	}
	return nil, &backendError{msg: fmt.Sprintf("cannot use the %s backend at %s: %s", u.Scheme, where, msg)}
}

// refused reports whether err says that no server listens at the address
// or that the host name does not resolve: a wrong URL or a stopped server.
func refused(err error) bool {
	var dns *net.DNSError
	msg := err.Error()
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &dns) ||
		strings.Contains(msg, "connection refused") || strings.Contains(msg, "no such host")
}

// oneLine joins the lines of a client library's multi-line message (pgx
// lists every address it tried, often the same one twice) into one line,
// without repeats, so each failure is one line on stderr.
func oneLine(msg string) string {
	if !strings.Contains(msg, "\n") {
		return msg
	}
	var parts []string
	seen := map[string]bool{}
	for _, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || seen[l] {
			continue
		}
		seen[l] = true
		parts = append(parts, strings.TrimSuffix(l, ":"))
	}
	return strings.Join(parts, ": ")
}

// scrub removes every credential of the URL u from a message, in case a
// client library quoted it (driver.RedactText).
func scrub(msg string, u *url.URL) string {
	if u == nil {
		return msg
	}
	return driver.RedactText(msg, u.String())
}

// fail prints err for the command and returns its exit status.
func (e *env) fail(cmd string, err error, u *url.URL) int {
	var be *backendError
	switch {
	case errors.As(err, &be):
		fmt.Fprintf(e.stderr, "fencelock %s: %s\n", cmd, be.msg)
		return be.status()
	case errors.Is(err, fencelock.ErrInvalidKey), errors.Is(err, fencelock.ErrInvalidOption):
		fmt.Fprintf(e.stderr, "fencelock %s: %s\n", cmd, scrub(err.Error(), u))
		return exitUsage
	case errors.Is(err, fencelock.ErrUnsupported):
		fmt.Fprintf(e.stderr, "fencelock %s: %s\n", cmd, scrub(err.Error(), u))
		return exitUnavailable
	}
	fmt.Fprintf(e.stderr, "fencelock %s: %s\n", cmd, scrub(err.Error(), u))
	return exitUnavailable
}

func (e *env) parsedURL(cf *connFlags) *url.URL {
	raw, _ := e.rawURL(cf)
	u, _ := url.Parse(raw)
	return u
}

// guaranteeNames lists the guarantees --require takes, for help texts.
func guaranteeNames() string {
	names := make([]string, len(driver.AllGuarantees))
	for i, g := range driver.AllGuarantees {
		names[i] = string(g)
	}
	return strings.Join(names, ", ")
}
