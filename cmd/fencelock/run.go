package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/recipe"
)

const runUsage = `
Usage: fencelock run [flags] KEY -- COMMAND [ARG...]
       fencelock run --permits N [flags] KEY -- COMMAND [ARG...]
       fencelock run --shared [flags] KEY -- COMMAND [ARG...]
       fencelock run [flags] KEY1 KEY2... -- COMMAND [ARG...]

Acquire the lock KEY (waiting while someone else holds it, unless --no-wait),
run COMMAND while holding it, release it when COMMAND exits, and exit with
COMMAND's exit status. The lease is renewed in the background (every TTL/3).
COMMAND gets these environment variables:

  FENCELOCK_KEY     the lock's key
  FENCELOCK_TOKEN   the fencing token: a number that strictly increases with
                    every grant of KEY; pass it with every write to the
                    protected resource, which should refuse tokens lower
                    than the highest it has seen
  FENCELOCK_OWNER   the holder's name, as 'fencelock status' shows it

With several keys (fencelock run K1 K2 K3 -- COMMAND), run takes every one
of them or none (recipe.AcquireAll: in sorted order, so runs naming
overlapping keys never deadlock; a run that gives up leaves none held), and
COMMAND gets FENCELOCK_KEYS (the number of keys), FENCELOCK_KEY_I and
FENCELOCK_TOKEN_I for I = 1..n in the order the keys were named, and
FENCELOCK_KEY and FENCELOCK_TOKEN for the first. A lost key stops COMMAND
as a lost lock does, and every key is released together.

If the lease is lost while COMMAND runs (the store no longer has it, or it
could not be renewed in time), or is about to be (no renewal confirmed by the store in time,
and less than one renewal interval of its local validity is left: the danger
zone), COMMAND is stopped, so that it is dead before anyone else can hold the
lock: SIGTERM when the danger zone begins, SIGKILL --grace later but always
before the lease's local validity ends, and fencelock exits with status 79.
After a loss another holder may have the lock already (release --force, or a
fencelock frozen past the TTL): COMMAND gets SIGKILL at once. Signals sent to fencelock
(INT, TERM, HUP, QUIT, USR1, USR2) are forwarded to COMMAND. The lock is
released on every exit path. COMMAND runs in its own process group (so a lost
lease stops its children too), except when fencelock's stdin is a terminal:
then it stays in fencelock's group so that it can use the terminal, and
terminal-generated INT and QUIT reach it directly rather than being forwarded.

With --permits N, KEY is a semaphore of N permits: at most N runs with the
same KEY and the same N hold a permit at once, across every host using the
store. Each permit is a lock on the slot key KEY/.permit/I (0 <= I < N),
with its own token: FENCELOCK_KEY is that slot key, and a fenced resource
checks FENCELOCK_TOKEN against it. A run whose N differs from the one a
holder recorded is refused (exit 64).

With --shared, KEY is a read-write lock and the run holds a read (shared)
grant: any number of --shared runs of KEY at once, none while a writer
(a program using fencelock's RWLock.Lock) holds KEY or waits for it. A
plain run KEY is not a writer: it locks the key KEY itself, and the
read-write lock uses other keys (KEY/.rw/gate, KEY/.rw/r/I), so the two do
not exclude each other. FENCELOCK_KEY is KEY and FENCELOCK_TOKEN the
gate token the grant entered under: a fenced resource accepts a read whose
token is at least the highest writer's token it has seen.

With --lock-delay D, a KEY whose last holder ended without releasing it (its
fencelock crashed or lost the lease) is taken only D after that end, by the
store's clock; a released KEY is taken at once. Use it when COMMAND writes to
something that cannot check FENCELOCK_TOKEN: a paused holder's late writes
then land before the next holder starts, if its pause is shorter than D.

With --min-hold D, a COMMAND that finishes before D has passed since KEY was
granted leaves KEY held until then (ShedLock's lockAtLeastFor), so a
scheduled job started on several hosts runs on one of them only. On stores
that keep a lock by its TTL (file, PostgreSQL, Redis, MongoDB) fencelock
exits when COMMAND does and the store frees KEY when the hold ends; on etcd,
ZooKeeper and other session stores fencelock stays, renewing, until then.

Exit status:
  N       COMMAND exited with status N
  128+N   COMMAND was killed by signal N
  64      usage error (bad flags, bad key, bad URL or unknown URL scheme;
          with --permits, a holder of KEY uses another number of permits)
  69      the backend cannot be opened or reached, or failed
  75      the lock was not acquired: held by someone else (--no-wait), or
          --timeout passed
  79      the lease was lost, or in its danger zone, while COMMAND ran;
          COMMAND was stopped (or had already finished, but not exclusively)
  126     COMMAND is not executable
  127     COMMAND was not found
`

const runExamples = `Examples:
  # Only one backup at a time on this machine (embedded file backend):
  fencelock run backup -- ./backup.sh --full

  # Skip this cron run if the previous one still holds the lock:
  fencelock run --no-wait jobs/nightly -- make nightly || [ $? -eq 75 ]

  # Run a cron job on one host only, at most once per 5 minutes, however
  # fast it is:
  fencelock run --no-wait --min-hold 5m jobs/report -- ./report.sh || [ $? -eq 75 ]

  # Across machines, via Redis, waiting at most a minute:
  fencelock run --url redis://redis.internal:6379 --timeout 1m deploy/web -- ./deploy.sh

  # At most 4 concurrent backups across the fleet:
  fencelock run --url postgres://locks@db/app --permits 4 backup -- ./backup.sh

  # Pass the fencing token on to the resource:
  fencelock run accounts/1 -- sh -c 'psql -v ON_ERROR_STOP=1 -v token="$FENCELOCK_TOKEN" -v owner="$FENCELOCK_OWNER" -f write.sql'  # write.sql: docs/fencing.md`

// runFlags are the parsed and checked arguments of `fencelock run`.
type runFlags struct {
	cf        connFlags
	key       string
	argv      []string
	ttl       time.Duration
	noWait    bool
	timeout   time.Duration
	grace     time.Duration
	graceSet  bool // --grace was given; otherwise it is the most the danger zone allows
	summary   bool
	minHold   time.Duration
	lockDelay time.Duration
	permits   int  // 0: a plain lock; else a semaphore of this many permits
	shared    bool // a read grant of the read-write lock KEY

	keys  []string           // every KEY named, in the order given (one for a plain lock)
	grant *recipe.RWGrant    // with shared: the read grant, once acquired
	multi *recipe.MultiGrant // with several keys: the grant, once acquired
}

// held is what run supervises while COMMAND runs: a lease, or a grant of
// several keys (every lease of which ends with any one).
type held interface {
	Done() <-chan struct{}
	Err() error
	Remaining() time.Duration
	Key() string
	Token() fencelock.Token
	Release(ctx context.Context) error
}

// multiHeld is a multi-key grant as run supervises it: named by its keys.
type multiHeld struct{ *recipe.MultiGrant }

func (m multiHeld) Key() string { return strings.Join(m.Keys(), ", ") }

func (m multiHeld) Token() fencelock.Token { return m.Leases()[0].Token() }

func cmdRun(e *env, args []string) int {
	rf, exit, stop := e.parseRun(args)
	if stop {
		return exit
	}
	return e.run(rf)
}

// parseRun parses run's arguments; stop is true (with the exit status)
// when the command must not go on: help was shown, or a usage error.
func (e *env) parseRun(args []string) (rf runFlags, exit int, stop bool) {
	fset := e.flagSet("run", runUsage, runExamples)
	addConnFlags(fset, &rf.cf)
	fset.Func("ttl", "lease time to live `D`, at least 1s: how long the lock outlives a crashed fencelock\n(default 15s, or the URL's ttl parameter)", func(v string) (err error) {
		rf.ttl, err = driver.ParseTTL("--ttl", v)
		return err
	})
	fset.Bool("wait", true, "wait while someone else holds KEY (the default)")
	fset.BoolVar(&rf.noWait, "no-wait", false, "do not wait: exit 75 at once if KEY is held")
	fset.DurationVar(&rf.timeout, "timeout", 0, "stop waiting after `D` and exit 75 (default: wait as long as it takes)")
	fset.DurationVar(&rf.grace, "grace", 0, "time `D` between SIGTERM and SIGKILL when the lease enters its danger zone;\nat most 4/5 of the renewal interval (default: that most, 4s with the default TTL)")
	fset.DurationVar(&rf.minHold, "min-hold", 0, "keep KEY held for at least `D` from the grant, even if COMMAND exits sooner\n(ShedLock's lockAtLeastFor: a fast cron job still keeps the other hosts out)")
	fset.Func("lock-delay", "after a holder of KEY ends without releasing it (a crash, a lost lease), wait\n`D` more before taking it: a quiet gap for a paused holder's late writes to a resource\nthat cannot check FENCELOCK_TOKEN (default 0, or the URL's lock_delay parameter)", func(v string) (err error) {
		rf.lockDelay, err = driver.ParseLockDelay("--lock-delay", v)
		return err
	})
	fset.IntVar(&rf.permits, "permits", 0, "treat KEY as a semaphore of `N` permits: at most N concurrent runs hold one\n(each permit a lock on the slot key KEY/.permit/I; at most "+strconv.Itoa(recipe.MaxPermits)+")")
	fset.BoolVar(&rf.shared, "shared", false, "take a read (shared) hold of the read-write lock KEY: any number of --shared runs at once\n(up to "+strconv.Itoa(recipe.DefaultMaxReaders)+"), none beside a writer (recipe.RWLock.Lock); not exclusive against a plain run KEY")
	fset.BoolVar(&rf.summary, "summary", false, "on exit, print one line to stderr: token, wait and hold time, renewals,\nrenewal failures, danger-zone entries, and how the lease ended")
	pos, argv, exit, stop := e.parse(fset, args, keysBeforeDash(fset, args))
	if stop {
		return rf, exit, true
	}
	explicit := map[string]bool{}
	fset.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	rf.graceSet = explicit["grace"]
	rf.argv = argv
	switch {
	case len(pos) == 0:
		return rf, e.usageError("run", "missing KEY and COMMAND"), true
	case len(argv) == 0:
		return rf, e.usageError("run", "missing COMMAND (fencelock run KEY -- COMMAND [ARG...])"), true
	case explicit["wait"] && rf.noWait:
		return rf, e.usageError("run", "--wait and --no-wait are exclusive"), true
	case rf.noWait && explicit["timeout"]:
		return rf, e.usageError("run", "--timeout applies to waiting; it makes no sense with --no-wait"), true
	case explicit["timeout"] && rf.timeout == 0:
		// flock(1) -w 0 means "do not wait"; here 0 would mean "no
		// timeout": refuse rather than guess.
		return rf, e.usageError("run", "--timeout 0 is ambiguous: to not wait, use --no-wait (exit 75 at once if KEY is held); to wait as long as it takes, leave --timeout out"), true
	case rf.timeout < 0 || rf.grace < 0 || rf.ttl < 0 || rf.minHold < 0:
		return rf, e.usageError("run", "durations must not be negative"), true
	case rf.minHold > fencelock.MaxTTL:
		return rf, e.usageError("run", "--min-hold %v is longer than the longest lease (%v)", rf.minHold, fencelock.MaxTTL), true
	case explicit["permits"] && (rf.permits < 1 || rf.permits > recipe.MaxPermits):
		return rf, e.usageError("run", "--permits must be between 1 and %d", recipe.MaxPermits), true
	case rf.shared && explicit["permits"]:
		return rf, e.usageError("run", "--shared and --permits are exclusive"), true
	case len(pos) > 1 && (rf.shared || explicit["permits"]):
		return rf, e.usageError("run", "several keys take plain locks: --shared and --permits take one KEY"), true
	case len(pos) > recipe.MaxKeys:
		return rf, e.usageError("run", "at most %d keys at once", recipe.MaxKeys), true
	}
	rf.key, rf.keys = pos[0], pos
	for i, k := range pos {
		if err := driver.ValidateKey(k); err != nil {
			return rf, e.usageError("run", "%v", err), true
		}
		if slices.Contains(pos[:i], k) {
			return rf, e.usageError("run", "key %s named twice", strconv.Quote(k)), true
		}
	}
	if rf.permits > 0 {
		_, slots := recipe.Keys(rf.key, rf.permits)
		if slot := slots[rf.permits-1]; len(slot) > driver.MaxKeyLen {
			sep, _ := recipe.Keys("", rf.permits)
			return rf, e.usageError("run", "with --permits %d, KEY may be at most %d bytes: its slot keys (KEY%sI) must fit in %d",
				rf.permits, driver.MaxKeyLen-len(slot)+len(rf.key), sep, driver.MaxKeyLen), true
		}
	}
	if rf.shared {
		prefix, records := recipe.Keys(rf.key, 0)
		longest := len(prefix + "r/" + strconv.Itoa(recipe.DefaultMaxReaders-1)) // the last reader slot
		for _, r := range records {
			longest = max(longest, len(r))
		}
		if longest > driver.MaxKeyLen {
			sep, _ := recipe.Keys("", 0)
			return rf, e.usageError("run", "with --shared, KEY may be at most %d bytes: its read-write lock's keys (KEY%s…) must fit in %d",
				driver.MaxKeyLen-longest+len(rf.key), sep, driver.MaxKeyLen), true
		}
	}
	return rf, 0, false
}

// keysBeforeDash returns how many KEY arguments run's args name: those
// that follow the leading flags, one after another, up to a "--" (run
// K1 K2 K3 -- COMMAND); 1 otherwise (run KEY COMMAND, and run KEY
// [flags] -- COMMAND).
func keysBeforeDash(fset *flag.FlagSet, args []string) int {
	i := 0
	for i < len(args) && len(args[i]) > 1 && args[i][0] == '-' && args[i] != "--" {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		i++
		if f := fset.Lookup(name); f != nil && !hasValue {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				i++ // the flag's value
			}
		}
	}
	n := 0
	for i+n < len(args) && args[i+n] != "--" && !strings.HasPrefix(args[i+n], "-") {
		n++
	}
	if n > 1 && i+n < len(args) && args[i+n] == "--" {
		return n
	}
	return 1
}

// killAllowance is how long before the end of a lease's local validity
// COMMAND is sent SIGKILL at the latest: time for the kernel to deliver it
// and for fencelock to reap COMMAND, with room for a late timer. It is a
// fifth of the renewal interval, so --grace can be at most the other four
// fifths of the danger zone.
func killAllowance(o fencelock.Options) time.Duration { return o.RenewInterval / 5 }

// maxGrace is the longest --grace the danger zone leaves room for.
func maxGrace(o fencelock.Options) time.Duration { return o.RenewInterval - killAllowance(o) }

// run runs `fencelock run` with checked flags and returns its exit status.
func (e *env) run(rf runFlags) int {
	u := e.parsedURL(&rf.cf)
	// Signals: from here on, fencelock handles them. Before COMMAND
	// starts, a terminating signal abandons the wait.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stopWatcher := watchSignals(sigs, cancel)
	defer stopWatcher()
	// interrupted reports the signal that abandoned the wait, if any.
	interrupted := func() (int, bool) {
		var se *signalError
		if errors.As(context.Cause(ctx), &se) {
			return 128 + signalNumber(se.sig), true
		}
		return 0, false
	}
	if u != nil && strings.EqualFold(u.Scheme, "mem") {
		fmt.Fprintf(e.stderr, "fencelock run: warning: mem:// locks live inside this fencelock process only: they exclude no other process\n")
	}
	opts, danger, sum := runOptions(&rf, u)
	if sum != nil {
		// Registered before the client's closing defer, so it runs after
		// it and sees the release.
		defer sum.print(e.stderr, func(s string) string { return scrub(s, u) })
	}
	c, err := e.open(ctx, &rf.cf, opts, rf.key)
	if err != nil {
		if code, ok := interrupted(); ok {
			return code
		}
		return e.fail("run", err, u)
	}
	o := c.Options()
	// However the run ends, fencelock waits on the store no longer than
	// needed: see closeClient.
	closeWait := o.Margin
	defer func() { closeClient(c, closeWait) }()
	switch {
	case !rf.graceSet:
		rf.grace = maxGrace(o)
	case rf.grace > maxGrace(o):
		return e.usageError("run", "--grace %v is longer than the lease's danger zone leaves: with a %v TTL, renewed every %v, COMMAND must be dead within %v of the danger zone's start (the renewal interval less %v to kill it); use a shorter --grace or a longer --ttl",
			rf.grace, o.TTL, o.RenewInterval, maxGrace(o), killAllowance(o))
	}

	l, code, ok := e.acquireForRun(ctx, c, &rf, u, interrupted)
	if !ok {
		return code
	}
	if sum != nil {
		sum.setLease(l)
	}
	// From now on signals are COMMAND's: stop the watcher first, so that
	// it eats none of them, and honour one that arrived meanwhile.
	stopWatcher()
	var h held = l
	if rf.multi != nil {
		h = multiHeld{rf.multi}
	}
	if code, ok := interrupted(); ok {
		if err := releaseWithin(h, o.ReleaseTimeout); errors.Is(err, errNoAnswer) {
			closeWait = 0
		}
		return code
	}
	vars := childVars{key: l.Key(), token: l.Token(), owner: l.Owner()}
	if rf.grant != nil {
		// The read grant's fence is the read-write lock's key and the
		// gate token it entered under, not its slot lease's.
		vars.key, vars.token = rf.key, rf.grant.Token()
	}
	if rf.multi != nil {
		for _, k := range rf.keys {
			vars.multi = append(vars.multi, fmt.Sprintf("%s\x00%d", k, rf.multi.Token(k)))
		}
	}
	code, silent := e.runChild(h, vars, rf.argv, sigs, danger, rf.grace, killAllowance(o), o.ReleaseTimeout)
	if silent {
		closeWait = 0
	}
	waitForHold(l, u, sigs)
	return code
}

// recordSchemes are the URL schemes of stores that keep a record by its
// TTL, independently of the client's session: a lease released into its
// minimum hold stays in the store until the hold ends after fencelock has
// exited.
var recordSchemes = map[string]bool{"file": true, "mem": true, "postgres": true, "postgresql": true,
	"redis": true, "rediss": true, "mongodb": true, "mongodb+srv": true}

// waitForHold keeps fencelock (and its client) alive until the lease's
// minimum hold ends, when COMMAND finished inside it and the store is not
// known to keep the record by itself: a session store (etcd, ZooKeeper)
// drops a record with its client's session, so exiting would free the key
// early. A terminating signal ends the wait.
func waitForHold(l *fencelock.Lease, u *url.URL, sigs <-chan os.Signal) {
	if !errors.Is(context.Cause(l.Context()), fencelock.ErrHeldForMinimum) {
		return
	}
	if u == nil || recordSchemes[strings.ToLower(u.Scheme)] {
		return
	}
	t := time.NewTimer(time.Until(l.MinHoldEnd()))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return
		case s := <-sigs:
			if terminating(s) {
				return
			}
		}
	}
}

// runOptions returns the engine options for run, the channel that hears
// of the lease's danger zone (no renewal confirmed in time and less than one
// renewal interval of local validity is left), and the --summary observer
// (nil without --summary).
func runOptions(rf *runFlags, u *url.URL) (*fencelock.Options, <-chan struct{}, *runSummary) {
	danger := make(chan struct{}, 1)
	opts := &fencelock.Options{TTL: rf.ttl, MinHold: rf.minHold, LockDelay: rf.lockDelay, OnDanger: func(*fencelock.Lease, time.Duration) {
		select {
		case danger <- struct{}{}:
		default:
		}
	}}
	var sum *runSummary
	if rf.summary {
		sum = newRunSummary(rf.key)
		opts.Observer = sum
	}
	if u != nil && strings.EqualFold(u.Scheme, "file") {
		// Polling the file backend costs a local file read: poll often
		// for a prompt hand-over where inotify (Linux) is unavailable.
		opts.MaxBackoff = 100 * time.Millisecond
	}
	return opts, danger, sum
}

// watchSignals cancels ctx (through cancel) with a *signalError when a
// terminating signal arrives on sigs. The returned function stops watching
// and waits until the watcher has stopped; it may be called more than once.
func watchSignals(sigs <-chan os.Signal, cancel context.CancelCauseFunc) (stop func()) {
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case s := <-sigs:
				if terminating(s) {
					cancel(&signalError{s})
					return
				}
			case <-stopWatch:
				return
			}
		}
	}()
	return sync.OnceFunc(func() {
		close(stopWatch)
		<-watchDone
	})
}

// acquireForRun acquires rf.key for run. When it fails, ok is false and
// code is the exit status (its message printed).
func (e *env) acquireForRun(ctx context.Context, c *fencelock.Client, rf *runFlags, u *url.URL, interrupted func() (int, bool)) (l *fencelock.Lease, code int, ok bool) {
	if rf.permits > 0 {
		return e.acquirePermit(ctx, c, rf, u, interrupted)
	}
	if rf.shared {
		return e.acquireShared(ctx, c, rf, u, interrupted)
	}
	if len(rf.keys) > 1 {
		return e.acquireMulti(ctx, c, rf, u, interrupted)
	}
	var err error
	if rf.noWait {
		l, err = c.TryAcquire(ctx, rf.key)
	} else {
		actx, acancel := ctx, context.CancelFunc(func() {})
		if rf.timeout > 0 {
			actx, acancel = context.WithTimeout(ctx, rf.timeout)
		}
		l, err = c.Acquire(actx, rf.key)
		acancel()
		if err != nil && ctx.Err() == nil && actx.Err() != nil {
			holder := ""
			ictx, icancel := context.WithTimeout(context.Background(), rf.cf.connectTimeout)
			if info, ierr := c.Inspect(ictx, rf.key); ierr == nil && info.Locked() {
				holder = fmt.Sprintf("; held by %s (token %d, %v left)", strconv.Quote(info.Owner), info.Token, info.Remaining.Round(time.Millisecond))
			}
			icancel()
			fmt.Fprintf(e.stderr, "fencelock run: gave up waiting for %s after %v (--timeout)%s\n", strconv.Quote(rf.key), rf.timeout, holder)
			return nil, exitNotAcquired, false
		}
	}
	if err == nil {
		return l, 0, true
	}
	if code, ok := interrupted(); ok {
		return nil, code, false
	}
	if errors.Is(err, fencelock.ErrNotAcquired) {
		fmt.Fprintf(e.stderr, "fencelock run: %s; not waiting (--no-wait)\n", scrub(err.Error(), u))
		return nil, exitNotAcquired, false
	}
	return nil, e.fail("run", err, u), false
}

// acquirePermit is acquireForRun with --permits: a permit of the
// semaphore KEY.
func (e *env) acquirePermit(ctx context.Context, c *fencelock.Client, rf *runFlags, u *url.URL, interrupted func() (int, bool)) (l *fencelock.Lease, code int, ok bool) {
	sem, err := recipe.NewSemaphore(c, rf.key, rf.permits)
	if err != nil {
		return nil, e.fail("run", err, u), false
	}
	if rf.noWait {
		l, err = sem.TryAcquire(ctx)
	} else {
		actx, acancel := ctx, context.CancelFunc(func() {})
		if rf.timeout > 0 {
			actx, acancel = context.WithTimeout(ctx, rf.timeout)
		}
		l, err = sem.Acquire(actx)
		acancel()
		if err != nil && ctx.Err() == nil && actx.Err() != nil && !errors.Is(err, recipe.ErrPermitsMismatch) {
			fmt.Fprintf(e.stderr, "fencelock run: gave up waiting for one of the %d permits of %s after %v (--timeout)\n", rf.permits, strconv.Quote(rf.key), rf.timeout)
			return nil, exitNotAcquired, false
		}
	}
	if err == nil {
		return l, 0, true
	}
	if code, ok := interrupted(); ok {
		return nil, code, false
	}
	switch {
	case errors.Is(err, recipe.ErrPermitsMismatch):
		fmt.Fprintf(e.stderr, "fencelock run: %s\n", scrub(err.Error(), u))
		return nil, exitUsage, false
	case errors.Is(err, fencelock.ErrNotAcquired):
		fmt.Fprintf(e.stderr, "fencelock run: %s; not waiting (--no-wait)\n", scrub(err.Error(), u))
		return nil, exitNotAcquired, false
	}
	return nil, e.fail("run", err, u), false
}

// acquireMulti is acquireForRun with several keys: all of them, or none.
// l is the first key's lease (for the summary and the minimum hold); run
// supervises rf.multi.
func (e *env) acquireMulti(ctx context.Context, c *fencelock.Client, rf *runFlags, u *url.URL, interrupted func() (int, bool)) (l *fencelock.Lease, code int, ok bool) {
	var g *recipe.MultiGrant
	var err error
	if rf.noWait {
		g, err = recipe.TryAcquireAll(ctx, c, rf.keys)
	} else {
		actx, acancel := ctx, context.CancelFunc(func() {})
		if rf.timeout > 0 {
			actx, acancel = context.WithTimeout(ctx, rf.timeout)
		}
		g, err = recipe.AcquireAll(actx, c, rf.keys)
		acancel()
		if err != nil && ctx.Err() == nil && actx.Err() != nil {
			fmt.Fprintf(e.stderr, "fencelock run: gave up waiting for all of %s after %v (--timeout); none is held\n", quoteAll(rf.keys), rf.timeout)
			return nil, exitNotAcquired, false
		}
	}
	if err == nil {
		rf.multi = g
		return g.Lease(rf.keys[0]), 0, true
	}
	if code, ok := interrupted(); ok {
		return nil, code, false
	}
	if errors.Is(err, fencelock.ErrNotAcquired) {
		fmt.Fprintf(e.stderr, "fencelock run: %s; not waiting (--no-wait), none of %s is held\n", scrub(err.Error(), u), quoteAll(rf.keys))
		return nil, exitNotAcquired, false
	}
	return nil, e.fail("run", err, u), false
}

// quoteAll quotes every key of keys, comma-separated.
func quoteAll(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = strconv.Quote(k)
	}
	return strings.Join(q, ", ")
}

// acquireShared is acquireForRun with --shared: a read grant of the
// read-write lock KEY. Its only lease is its reader slot's, which run
// supervises as it would a lock's; rf.grant keeps the grant for its token.
func (e *env) acquireShared(ctx context.Context, c *fencelock.Client, rf *runFlags, u *url.URL, interrupted func() (int, bool)) (l *fencelock.Lease, code int, ok bool) {
	rw, err := recipe.NewRWLock(c, rf.key)
	if err != nil {
		return nil, e.fail("run", err, u), false
	}
	var g *recipe.RWGrant
	if rf.noWait {
		g, err = rw.TryRLock(ctx)
	} else {
		actx, acancel := ctx, context.CancelFunc(func() {})
		if rf.timeout > 0 {
			actx, acancel = context.WithTimeout(ctx, rf.timeout)
		}
		g, err = rw.RLock(actx)
		acancel()
		if err != nil && ctx.Err() == nil && actx.Err() != nil {
			fmt.Fprintf(e.stderr, "fencelock run: gave up waiting for a shared hold of %s after %v (--timeout)\n", strconv.Quote(rf.key), rf.timeout)
			return nil, exitNotAcquired, false
		}
	}
	if err == nil {
		rf.grant = g
		return g.Lease(), 0, true
	}
	if code, ok := interrupted(); ok {
		return nil, code, false
	}
	if errors.Is(err, fencelock.ErrNotAcquired) {
		fmt.Fprintf(e.stderr, "fencelock run: %s; not waiting (--no-wait)\n", scrub(err.Error(), u))
		return nil, exitNotAcquired, false
	}
	return nil, e.fail("run", err, u), false
}

type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "interrupted by " + e.sig.String() }

// errNoAnswer is releaseWithin's error when the store did not answer in
// time.
var errNoAnswer = errors.New("no answer from the store within the lease's local validity")

// releaseWithin releases l, waiting on the store at most d and never past
// the lease's local validity: once that has ended, the store frees the key
// by itself within the lease's margin, and a release can gain nothing the
// command should wait for. It does not rely on the backend's client library
// to honour the context's deadline (go-redis, by default, does not): a
// release still running at the deadline goes on in the background.
func releaseWithin(l held, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), min(d, l.Remaining()))
	errc := make(chan error, 1)
	go func() {
		defer cancel()
		errc <- l.Release(ctx)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		select {
		case err := <-errc:
			return err
		default:
			return fmt.Errorf("%w: %w", errNoAnswer, ctx.Err())
		}
	}
}

// closeClient closes c, waiting at most wait for it: the client's Margin,
// or nothing once the store has failed to answer the release. By the time
// it is called the lease has been released (each store call bounded by its
// local validity) or lost; what Close may still wait for is the engine's
// best-effort release of a lost lease (up to ReleaseTimeout) and a renewal
// in flight to an unreachable store. Neither is worth delaying the exit
// status for: the store frees a lost lease's key by itself within Margin of
// its local validity's end. A Close that takes longer goes on in the
// background until the process exits.
func closeClient(c *fencelock.Client, wait time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Close()
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// runningCmd is COMMAND, running under the lease: the process, and how
// fencelock stops it when the lease is in danger or lost.
type runningCmd struct {
	e         *env
	cmd       *exec.Cmd
	l         held
	group     bool          // COMMAND has a process group of its own
	grace     time.Duration // between SIGTERM and SIGKILL
	allowance time.Duration // SIGKILL at least this long before local validity ends
	done      chan struct{} // closed when COMMAND has been reaped

	stopping  bool          // SIGTERM sent (or SIGKILL at once)
	killed    bool          // SIGKILL sent
	kill      *time.Timer   // fires killAfter after SIGTERM
	killAfter time.Duration // min(grace, what the lease's local validity leaves)
}

// runChild runs argv while l is held and returns fencelock's exit status,
// and whether the store failed to answer the release (silent). danger
// receives the lease's entry into its danger zone.
func (e *env) runChild(l held, vars childVars, argv []string, sigs <-chan os.Signal, danger <-chan struct{}, grace, allowance, releaseTimeout time.Duration) (code int, silent bool) {
	ch, err := e.startChild(l, vars, argv, grace, allowance)
	if err != nil {
		rerr := releaseWithin(l, releaseTimeout)
		fmt.Fprintf(e.stderr, "fencelock run: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return exitNotFound, errors.Is(rerr, errNoAnswer)
		}
		return exitCannotExec, errors.Is(rerr, errNoAnswer)
	}
	ch.supervise(sigs, danger)
	return ch.finish(releaseTimeout)
}

// childVars are what COMMAND gets as FENCELOCK_KEY, FENCELOCK_TOKEN and
// FENCELOCK_OWNER.
type childVars struct {
	key   string
	token fencelock.Token
	owner string
	multi []string // with several keys: "KEY\x00TOKEN" of each, in the order named
}

// startChild starts argv with vars in its environment; l is the lease it
// runs under.
func (e *env) startChild(l held, vars childVars, argv []string, grace, allowance time.Duration) (*runningCmd, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = e.stdin, e.stdout, e.stderr
	cmd.Env = append(os.Environ(),
		"FENCELOCK_KEY="+vars.key,
		"FENCELOCK_TOKEN="+strconv.FormatUint(uint64(vars.token), 10),
		"FENCELOCK_OWNER="+vars.owner)
	if len(vars.multi) > 0 {
		cmd.Env = append(cmd.Env, "FENCELOCK_KEYS="+strconv.Itoa(len(vars.multi)))
		for i, kt := range vars.multi {
			k, t, _ := strings.Cut(kt, "\x00")
			cmd.Env = append(cmd.Env, fmt.Sprintf("FENCELOCK_KEY_%d=%s", i+1, k), fmt.Sprintf("FENCELOCK_TOKEN_%d=%s", i+1, t))
		}
	}
	ch := &runningCmd{e: e, cmd: cmd, l: l, group: !stdinIsTerminal(), grace: grace, allowance: allowance, done: make(chan struct{})}
	setProcAttr(cmd, ch.group)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		cmd.Wait()
		close(ch.done)
	}()
	return ch, nil
}

// supervise forwards signals to COMMAND and stops it when the lease enters
// its danger zone or is lost, until COMMAND has exited and been reaped.
func (ch *runningCmd) supervise(sigs <-chan os.Signal, danger <-chan struct{}) {
	leaseCh := ch.l.Done()
	var kill <-chan time.Time
	defer func() {
		if ch.kill != nil {
			ch.kill.Stop()
		}
	}()
	for {
		select {
		case <-ch.done:
			return
		case s := <-sigs:
			if ch.group || !fromTerminal(s) {
				signalChild(ch.cmd.Process, s, ch.group)
			}
		case <-danger:
			danger = nil
			ch.stop(fmt.Sprintf("the lease on %s is in its danger zone: the store has not confirmed a renewal in time (renewals failed or went unanswered), and it will be lost in %v unless one succeeds",
				strconv.Quote(ch.l.Key()), ch.l.Remaining().Round(time.Millisecond)))
			if ch.kill != nil {
				kill = ch.kill.C
			}
		case <-leaseCh:
			leaseCh = nil
			err := ch.l.Err()
			if err == nil {
				continue // released: only after COMMAND exited
			}
			fmt.Fprintf(ch.e.stderr, "fencelock run: %v\n", err)
			// Another holder may have the lock already: no more grace.
			ch.stopping = true
			ch.killNow("the lease is lost, another holder may have the lock already")
		case <-kill:
			kill = nil
			select {
			case <-ch.done:
				return // it did stop, just now
			default:
			}
			ch.killNow(fmt.Sprintf("the command did not stop within %v of SIGTERM", ch.killAfter.Round(time.Millisecond)))
		}
	}
}

// stop sends COMMAND SIGTERM, once, and arms its SIGKILL: after the grace
// period, but at least the allowance before the lease's local validity
// ends (at once if that is already too late). why is printed.
func (ch *runningCmd) stop(why string) {
	if ch.stopping {
		return
	}
	ch.stopping = true
	d := max(0, min(ch.grace, ch.l.Remaining()-ch.allowance))
	fmt.Fprintf(ch.e.stderr, "fencelock run: %s\nfencelock run: stopping the command: SIGTERM now, SIGKILL in %v\n", why, d.Round(time.Millisecond))
	signalChild(ch.cmd.Process, sigTERM, ch.group)
	if d == 0 {
		ch.killNow("")
		return
	}
	ch.killAfter = d
	ch.kill = time.NewTimer(d)
}

// killNow sends COMMAND (its process group) SIGKILL, once. why, if not
// empty, is printed.
func (ch *runningCmd) killNow(why string) {
	if ch.killed {
		return
	}
	ch.killed = true
	if ch.kill != nil {
		ch.kill.Stop()
	}
	if why != "" {
		fmt.Fprintf(ch.e.stderr, "fencelock run: %s: SIGKILL now\n", why)
	}
	signalChild(ch.cmd.Process, sigKILL, ch.group)
}

// finish releases the lease after COMMAND has exited and returns
// fencelock's exit status. A lost lease is not released (there is nothing
// of ours left in the store; the engine has already tried to free the key
// if the store might still have it).
func (ch *runningCmd) finish(releaseTimeout time.Duration) (code int, silent bool) {
	l := ch.l
	if l.Err() != nil {
		return exitLeaseLost, false
	}
	remaining := l.Remaining()
	err := releaseWithin(l, releaseTimeout)
	silent = errors.Is(err, errNoAnswer)
	switch {
	case errors.Is(err, fencelock.ErrNotHeld):
		fmt.Fprintf(ch.e.stderr, "fencelock run: when the command finished, the lock on %s was no longer held (token %d): the command may not have run exclusively\n", strconv.Quote(l.Key()), l.Token())
		return exitLeaseLost, silent
	case err != nil:
		fmt.Fprintf(ch.e.stderr, "fencelock run: warning: release failed (the lock expires with its TTL): %v\n", err)
	}
	switch {
	case ch.stopping:
		return exitLeaseLost, silent
	case remaining == 0:
		fmt.Fprintf(ch.e.stderr, "fencelock run: the lease on %s ran out of local validity as the command finished: it may not have run exclusively\n", strconv.Quote(l.Key()))
		return exitLeaseLost, silent
	}
	return exitStatus(ch.cmd.ProcessState), silent
}

func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return exitSoftware
	}
	if n, ok := signaled(ps); ok {
		return 128 + n
	}
	return ps.ExitCode()
}
