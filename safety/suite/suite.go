// Package suite runs fencelock's fault-injection safety suite against any
// backend URL and returns the backend × fault report of docs/safety.md
// (package safety/report): the same cells, checker, verdicts and numbers
// as the repository's own TestSafety, which is a caller of Run.
//
// A team runs it from its own `go test` (or uses the `fencelock safety`
// command, which calls Run):
//
//	func TestMain(m *testing.M) {
//		suite.MainIfContender() // first: contenders are re-executions of this binary
//		os.Exit(m.Run())
//	}
//
//	func TestSafety(t *testing.T) {
//		rep, err := suite.Run(ctx, suite.Config{
//			Backends: []suite.Backend{{URL: os.Getenv("LOCK_URL")}},
//			OutDir:   t.TempDir(),
//		})
//		if err != nil || rep.Failed() { … }
//	}
//
// The URL's scheme must be registered with fencelock (import the backend
// package, third-party ones included): the contender processes run the
// same binary and open the same driver.
//
// # Faults
//
// Faults that need nothing from the caller run on every backend: holder
// pause and kill (the contenders are processes), network faults on one
// contender's path to the store through its own faultproxy, which fronts
// the URL's host:port (blackhole, latency, reset, a reply dropped after
// the request took effect), stale release and renew, token rotation with
// batch renewal and waiting, coalesced acquisitions and releases (where
// the backend batches them), and the fencing-off negative control. Faults
// of the server (kill and restart, pause, failover) run only when the
// backend's Control can do them, and are otherwise listed in the report's
// NotRun with the reason; so are the network faults when the URL has no
// single host:port to put the proxy in front of (file://, several hosts,
// a Sentinel).
//
// Contenders and the harness stamp events with CLOCK_MONOTONIC and the
// fenced resource listens on a unix socket: the suite runs on Linux.
package suite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/safety/contender"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/report"
)

// Names of the faults and controls (report.Cell.Fault), for
// Config.Faults.
const (
	FaultBaseline       = fBaseline      // no fault: the workload alone
	FaultHolderPause    = fHolderPause   // a holder SIGSTOPped (between lease check and write, and at random)
	FaultHolderKill     = fHolderKill    // a holder SIGKILLed
	FaultBlackhole      = fBlackhole     // proxy: one holder's packets to the store dropped
	FaultLatency        = fLatency       // proxy: latency on one holder's path
	FaultConnReset      = fReset         // proxy: one holder's connections reset
	FaultAmbAcquire     = fAmbAcquire    // proxy: an acquire's reply dropped after it took effect
	FaultAmbRelease     = fAmbRelease    // proxy: a release's reply dropped after it took effect
	FaultStaleOps       = fStaleOps      // a stale Release and Renew of an old grant
	FaultRotation       = fRotation      // token rotation, batch renewal, waiting
	FaultCoalesced      = fCoalesced     // many workers per client: coalesced acquisitions and releases, a holder paused, then one killed
	FaultServerKill     = fStoreKill     // Control.Restart
	FaultServerPause    = fStorePause    // Control.Pause, Control.Resume
	FaultFailover       = fFailover      // Control.Failover (named Control.FailoverName in the report)
	FaultRedisFlushall  = fRedisFlushall // redis:// only; destructive: FLUSHALL of the server
	FaultRedisExpiry    = fRedisExpire   // redis:// only: PEXPIRE 1 on a lock key of the suite
	ControlFencingOff   = fFencingOff    // negative control: the fenced resource accepts every write
	ControlMutantPrefix = mutantPrefix   // negative controls: deliberately broken backends ("mutant-…")
)

// Groups of faults Config.Faults may name.
const (
	// GroupDefault is DefaultFaults.
	GroupDefault = "default"
	// GroupMutants is every mutant-backend negative control.
	GroupMutants = "mutants"
)

// DefaultFaults are the faults of a Config without Faults: every fault
// and the fencing-off control, but not FaultRedisFlushall (it deletes
// every key of the Redis server) and not the mutants.
var DefaultFaults = []string{
	FaultBaseline, FaultHolderPause, FaultHolderKill, FaultBlackhole, FaultLatency, FaultConnReset,
	FaultAmbAcquire, FaultAmbRelease, FaultStaleOps, FaultRotation, FaultCoalesced, FaultServerKill, FaultServerPause,
	FaultFailover, FaultRedisExpiry, ControlFencingOff,
	FaultSemBaseline, FaultSemHolderPause, FaultSemHolderKill,
	FaultRWBaseline, FaultRWHolderPause, FaultRWHolderKill,
	FaultMultiHolder, FaultUpgradeHolder,
	FaultCallBounds, FaultMixedConfig, FaultClockStall, FaultHolderPauseKit,
}

// mutantFaults are the names of the mutant controls.
var mutantFaults = []string{
	mutantPrefix + string(contender.MutantToken), mutantPrefix + string(contender.MutantExpiry),
	mutantPrefix + string(contender.MutantRelease), mutantPrefix + string(contender.MutantRenewAfterRelease),
}

// AllFaults lists every fault and control name Config.Faults accepts
// (besides the groups).
func AllFaults() []string {
	all := append(slices.Clone(DefaultFaults), FaultRedisFlushall)
	all = append(all, EvictionFaults...)
	all = append(all, MemberFaults...)
	all = append(all, FaultClockJump, FaultLockDelay, FaultSlotMigration)
	return append(all, mutantFaults...)
}

// Expectations returns a copy of the built-in expectation table: the cells
// that are unsafe by design (a Redis FLUSHALL or early expiry, a Redis
// Sentinel failover of the "redisha" cluster, …) and the negative controls
// with the properties they must fail. Run consults Config.Expect first,
// then this table, then rules a backend announces in its
// driver.Description's warnings.
func Expectations() report.Table { return slices.Concat(expectations, primExpectations) }

// Errors of Run; test for them with errors.Is.
var (
	// ErrConfig: the Config is not valid (no backend, an unknown fault, a
	// duplicate backend name, …).
	ErrConfig = errors.New("suite: invalid config")
	// ErrBackend: a backend could not be opened; its cells did not run.
	ErrBackend = errors.New("suite: backend unavailable")
	// ErrTimeBound: Config.Timeout ran out before every cell ran; the
	// cells left are in the report's NotRun.
	ErrTimeBound = errors.New("suite: time bound reached")
	// ErrContender: MainIfContender found a contender configuration but
	// the contender failed.
	ErrContender = errors.New("suite: contender failed")
)

// CellError is a cell the harness could not run to the end (a contender
// that did not start, a fault that could not be injected or lifted, the
// cell's time bound): it has no verdict.
type CellError struct {
	Backend, Fault string
	// History is the file with the cell's history so far, "" if none.
	History string
	Err     error
}

func (e *CellError) Error() string {
	s := fmt.Sprintf("suite: %s/%s: %v", e.Backend, e.Fault, e.Err)
	if e.History != "" {
		s += " (history: " + e.History + ")"
	}
	return s
}

func (e *CellError) Unwrap() error { return e.Err }

// Control lets the suite act on a backend's server. Each func returns once
// its action is done; a nil func leaves its fault out (listed in the
// report's NotRun). Commands builds one from shell commands.
type Control struct {
	// Restart kills the server abruptly (as kill -9 would) and starts it
	// again with its data, and returns once it serves again
	// (FaultServerKill).
	Restart func(ctx context.Context) error
	// Pause stops the server without closing its connections (SIGSTOP);
	// Resume continues it. Both are needed for FaultServerPause. Resume is
	// always called after a successful Pause.
	Pause, Resume func(ctx context.Context) error
	// Failover kills the leader or primary, waits until another one
	// serves, and starts the old one again (FaultFailover); it returns a
	// note for the fault's event, such as the member it killed.
	Failover func(ctx context.Context) (string, error)
	// FailoverName is the name of the failover cell in the report
	// (default FaultFailover).
	FailoverName string
	// FailoverKey, if set, is Failover aimed at the node that serves
	// key (a Redis Cluster's master of the key's slot): the failover
	// cell passes the key a contender holds now. It is used instead of
	// Failover.
	FailoverKey func(ctx context.Context, key string) (string, error)
	// MigrateKeys moves keys (the ones a cell locks, the held one
	// first) to another node of a sharded store, live, while they are
	// held and waited on, and returns a note for the fault's event:
	// FaultSlotMigration.
	MigrateKeys func(ctx context.Context, keys []string) (string, error)
	// Members are the client addresses (host:port) of the members of a
	// cluster, for FaultMemberPause and FaultMemberIsolated: contender n
	// connects to member (n-1) mod len(Members) alone (the backend's URL
	// with only that host). PauseMember stops member i (an index into
	// Members) with SIGSTOP and ResumeMember continues it; all three are
	// needed for those faults.
	Members                   []string
	PauseMember, ResumeMember func(ctx context.Context, i int) error
	// PartitionMember cuts member i off from the other members (its
	// peer links: a ZooKeeper node's quorum and election ports), while
	// its clients still reach it; HealMember ends that and returns once
	// the cluster is whole again; MemberLeads reports whether member i
	// leads now. All three, with Members, are needed for
	// FaultFollowerPartitioned.
	PartitionMember, HealMember func(ctx context.Context, i int) error
	// MembersServe, if set, returns once every member serves again (a
	// cluster whole, with one leader): the member faults (pause,
	// isolation) end there, after ResumeMember, as a failover ends once
	// the cluster is whole. A paused member that led costs an election
	// and its clients' sessions moving; the progress bound (P6) counts
	// from the end of that, not from the SIGCONT.
	MembersServe func(ctx context.Context) error
	MemberLeads  func(ctx context.Context, i int) (bool, error)
	// ClockJump moves the server's wall clock forward by d from where it
	// is (libfaketime, a VM's clock, …) and returns once the server reads
	// the new time: FaultClockJump.
	ClockJump func(ctx context.Context, d time.Duration) error
	// Setup describes, per fault name (FaultServerKill, …), what the
	// control does, for the report's setup column; a fault without one
	// gets a generic description.
	Setup map[string]string
}

func (c *Control) setup(fault, def string) string {
	if s := c.Setup[fault]; s != "" {
		return s
	}
	return def
}

// Backend is one store under test.
type Backend struct {
	// Name is the backend's row in the report. Default: the name the
	// driver gives itself (driver.Description.Name), else the URL's
	// scheme; a second backend of that name gets "-2", and so on.
	Name string
	// URL opens the store (fencelock.OpenBackend). Required. It is never
	// printed or written to the report unredacted.
	URL string
	// TTL is the lease TTL (the session timeout for zk://, set in the URL
	// as session_timeout). Default 2s for etcd (whole seconds, at least
	// 1.5 election timeouts), 1s otherwise.
	TTL time.Duration
	// Slack is the checker's measurement slack (check.Config.Slack).
	// Default 700ms for etcd, 500ms for ZooKeeper, 300ms otherwise.
	Slack time.Duration
	// NoProxy says the URL's host:port is not the store's only connection
	// (a Sentinel that names the primary, several hosts, two stores
	// behind one URL): the network faults are then not run. It is implied
	// for URLs without exactly one host:port.
	NoProxy bool
	// Control, if set, lets the suite kill, restart, pause or fail over
	// the server.
	Control *Control
	// Peer, if set, measures another lock library on this store instead
	// of fencelock (see Peer): the URL is not opened with fencelock.
	Peer *Peer
}

// Peer is a lock library other than fencelock, measured by the same
// cells (PeerFaults) for the report's comparison. Its contenders run
// the program of the binary's own hook, which must come before
// MainIfContender in its main or TestMain: it reads the
// contender.Config (whose Peer is Lib) from the environment and speaks
// the contender protocol (the events of package history; the commands
// OpPauseBeforeWrite and OpStop) with the library's own API.
// safety/peers is such a binary.
type Peer struct {
	// Lib names the library in contender.Config.Peer. Required.
	Lib string
	// Tokens says the library hands out a fencing token that the
	// contenders pass to the fenced resource. Without one the resource
	// runs with fencing off (every write accepted, each logged with the
	// decision fencing would have made), so P1 counts the writes of an
	// older holder accepted after a newer holder had written:
	// overlapping writes at an unfenced resource. P2 is then not judged.
	Tokens bool
}

// PeerFaults are the cells a Peer backend runs (those of them its
// Control allows): the faults that need nothing of fencelock's engine.
var PeerFaults = []string{FaultBaseline, FaultHolderPause, FaultHolderKill, FaultServerKill, FaultServerPause, FaultFailover}

// Config configures Run.
type Config struct {
	// Backends are the stores under test, run one after another.
	// Required.
	Backends []Backend
	// Faults are the faults and controls to run, by name (Fault…,
	// Control…, AllFaults), or the groups GroupDefault and GroupMutants.
	// Default: DefaultFaults. A fault that cannot run on a backend is in
	// the report's NotRun, with the reason; one that does not apply to it
	// (FaultRedisExpiry on postgres://) is left out silently.
	Faults []string
	// Rounds is how many times each fault is injected per cell (holder
	// pause: twice that). Default 1.
	Rounds int
	// Baseline is how long the fault-free cell runs. Default 5s.
	Baseline time.Duration
	// ControlRounds is the number of rounds of the fencing-off control,
	// at least 2. Default 3.
	ControlRounds int
	// Seed makes a run repeatable; 0 picks one at random. The report
	// records it (Report.Seed).
	Seed int64
	// Expect is the caller's expectation table: its rules come before
	// the built-in ones (Expectations), so it can declare a cell of its
	// own backend unsafe-expected, or tolerate a property.
	Expect report.Table
	// OutDir, if set, receives safety.md and safety.json (the report), and
	// in histories/ the history (JSON lines) of every cell that failed
	// the report or did not run to the end. Without it, such a history goes
	// to a temporary file named in the CellError or by Config.Cell.
	OutDir string
	// Timeout bounds the whole run (0: no bound besides ctx). Cells not
	// started when it runs out are in the report's NotRun and Run returns
	// ErrTimeBound.
	Timeout time.Duration
	// CellTimeout bounds one cell. Default 5 minutes.
	CellTimeout time.Duration
	// Profile names the run in the report. Default "custom".
	Profile string
	// Repro is the report's command to rerun one cell (report.Report.Repro,
	// with {backend}, {fault} and {seed}); ReproHint the sentence before
	// the commands.
	Repro, ReproHint string
	// Env is added to the report's Env (machine, versions, …).
	Env map[string]string
	// EnvURLs adds each backend's URL, redacted (driver.RedactURL), to the
	// report's Env as "url NAME".
	EnvURLs bool
	// Logf receives progress lines (one per cell, with its numbers).
	// Default: none.
	Logf func(format string, args ...any)
	// Cell, if set, runs each cell: it calls run at most once (not at
	// all skips the cell, which then is in neither Cells nor NotRun).
	// TestSafety wraps each cell in a subtest with it.
	Cell func(backend, fault string, run func() CellRun)
}

// CellRun is the outcome of one cell, as Config.Cell sees it.
type CellRun struct {
	// Cell is the cell as it goes into the report; Cell.Backend is ""
	// when Err stopped it before it could be checked.
	Cell report.Cell
	// Err is a *CellError when the harness could not run the cell to the
	// end.
	Err error
	// History is the file holding the cell's history when it failed the
	// report (Cell.Problem) or Err is set, else "".
	History string
	// Summary is one line with the cell's verdict and numbers.
	Summary string
}

// MainIfContender must be called first in the main function or TestMain
// of every binary that calls Run: the suite's contenders are re-executions
// of the running binary (os.Executable), with their configuration in the
// environment variable contender.EnvVar. When that variable is set,
// MainIfContender runs the contender and exits the process (status 0, or
// 1 after printing why to stderr); otherwise it returns at once.
func MainIfContender() {
	cfg, ok, err := contender.FromEnv()
	if !ok {
		return
	}
	if err == nil {
		err = contender.Main(cfg, os.Stdin, os.Stdout)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%v: contender %s: %v\n", ErrContender, cfg.Proc, driver.RedactText(err.Error(), cfg.URL))
		os.Exit(1)
	}
	os.Exit(0)
}

// Run runs the requested faults on every backend, one cell after another,
// and returns the report (the cells that ran, and NotRun). The report is
// also written to Config.OutDir. The error is nil when every requested
// cell ran to the end; else it joins ErrConfig, ErrBackend (wrapped with
// the backend's name), *CellError, and ErrTimeBound or ctx's error when
// cells were left unstarted. A report with
// Failed() true (an UNSAFE-UNEXPECTED cell, or a negative control not
// caught) is not an error: check rep.Failed().
func Run(ctx context.Context, cfg Config) (report.Report, error) {
	began := time.Now()
	plan, err := cfg.validate()
	if err != nil {
		return report.Report{}, err
	}
	exe, err := os.Executable()
	if err != nil {
		return report.Report{}, fmt.Errorf("suite: finding the executable for contenders: %w", err)
	}
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = randomSeed()
	}
	prof := profile{name: cfg.Profile, rounds: cfg.Rounds, baseline: cfg.Baseline, controls: cfg.ControlRounds, cellTimeout: cfg.CellTimeout}
	rep := report.Report{
		Profile:   prof.name,
		Seed:      seed,
		Started:   began.UTC().Truncate(time.Second),
		Repro:     cfg.Repro,
		ReproHint: cfg.ReproHint,
		Env: map[string]string{
			"go":       runtime.Version(),
			"platform": runtime.GOOS + "/" + runtime.GOARCH,
			"cpus":     strconv.Itoa(runtime.NumCPU()),
			"race":     strconv.FormatBool(raceEnabled),
		},
	}
	for k, v := range cfg.Env {
		rep.Env[k] = v
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var errs []error
	timeBound := false
	// stopped says why no more cells start: the time bound, or the
	// caller's ctx.
	stopped := func() string {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "time bound reached"
		}
		return "run cancelled"
	}
	if cfg.EnvURLs {
		for i, b := range cfg.Backends {
			rep.Env["url "+plan.names[i]] = driver.RedactURL(b.URL)
		}
	}
	for i, b := range cfg.Backends {
		name := plan.names[i]
		if ctx.Err() != nil {
			timeBound = true
			rep.NotRun = append(rep.NotRun, report.NotRun{Backend: name, Fault: "*", Why: stopped() + " before this backend's cells"})
			continue
		}
		be, err := openBackendEnv(ctx, b, name, exe, cfg.Expect)
		if err != nil {
			rep.NotRun = append(rep.NotRun, report.NotRun{Backend: name, Fault: "*", Why: err.Error()})
			errs = append(errs, fmt.Errorf("%w: %s: %v", ErrBackend, name, err))
			continue
		}
		specs, left := cellsFor(be, prof)
		for _, l := range left {
			if plan.faults[l.fault] {
				rep.NotRun = append(rep.NotRun, report.NotRun{Backend: name, Fault: l.fault, Why: l.why})
			}
		}
		for _, spec := range specs {
			canon := spec.fault
			if be.control != nil && be.control.FailoverName != "" && spec.fault == be.control.FailoverName {
				canon = fFailover
			}
			if !plan.faults[canon] {
				continue
			}
			if ctx.Err() != nil {
				timeBound = true
				rep.NotRun = append(rep.NotRun, report.NotRun{Backend: name, Fault: spec.fault, Why: stopped() + " before this cell"})
				continue
			}
			run := func() CellRun {
				r := runOne(ctx, be, spec, seed, prof, cfg.OutDir, logf)
				if r.Cell.Backend != "" {
					rep.Cells = append(rep.Cells, r.Cell)
				}
				if r.Err != nil {
					errs = append(errs, r.Err)
					if r.Cell.Backend == "" {
						// Nothing was judged: the report says so
						// rather than leave the cell out.
						rep.NotRun = append(rep.NotRun, report.NotRun{Backend: name, Fault: spec.fault,
							Why: "could not run to the end: " + errors.Unwrap(r.Err).Error()})
					}
				}
				return r
			}
			if cfg.Cell != nil {
				cfg.Cell(name, spec.fault, run)
			} else {
				run()
			}
		}
	}
	if timeBound {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			errs = append(errs, ErrTimeBound)
		} else {
			errs = append(errs, ctx.Err())
		}
	}
	rep.Duration = time.Since(began).Round(time.Second)
	if cfg.OutDir != "" {
		if err := writeReport(cfg.OutDir, rep); err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

// runOne runs one cell within the cell bound and keeps its history if it
// failed.
func runOne(ctx context.Context, be *backendEnv, spec cellSpec, seed int64, prof profile, outDir string, logf func(string, ...any)) CellRun {
	cctx, cancel := context.WithTimeout(ctx, prof.cellTimeout)
	defer cancel()
	rc, h, err := runCell(cctx, be, spec, seed, logf)
	var r CellRun
	r.Cell = rc
	if rc.Backend != "" {
		r.Summary = summary(rc)
		logf("%s", r.Summary)
	}
	if err != nil || (rc.Backend != "" && rc.Problem() != "") {
		r.History = saveHistory(outDir, be.name, spec.fault, h)
	}
	if err != nil {
		r.Err = &CellError{Backend: be.name, Fault: spec.fault, History: r.History, Err: err}
		logf("%v", r.Err)
	}
	return r
}

// plan is a validated Config's choices.
type plan struct {
	names  []string        // per backend
	faults map[string]bool // requested, by canonical name
}

func (cfg *Config) validate() (plan, error) {
	var p plan
	if len(cfg.Backends) == 0 {
		return p, fmt.Errorf("%w: no backend", ErrConfig)
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 1
	}
	if cfg.Baseline == 0 {
		cfg.Baseline = 5 * time.Second
	}
	if cfg.ControlRounds == 0 {
		cfg.ControlRounds = 3
	}
	if cfg.CellTimeout == 0 {
		cfg.CellTimeout = 5 * time.Minute
	}
	if cfg.Profile == "" {
		cfg.Profile = "custom"
	}
	switch {
	case cfg.Rounds < 0:
		return p, fmt.Errorf("%w: Rounds %d is negative", ErrConfig, cfg.Rounds)
	case cfg.Baseline < 0 || cfg.CellTimeout < 0 || cfg.Timeout < 0:
		return p, fmt.Errorf("%w: negative duration", ErrConfig)
	case cfg.ControlRounds < 2:
		return p, fmt.Errorf("%w: ControlRounds %d: the fencing-off control needs at least 2", ErrConfig, cfg.ControlRounds)
	}
	faults := cfg.Faults
	if len(faults) == 0 {
		faults = []string{GroupDefault}
	}
	p.faults = map[string]bool{}
	all := AllFaults()
	for _, f := range faults {
		switch {
		case f == GroupDefault:
			for _, d := range DefaultFaults {
				p.faults[d] = true
			}
		case f == GroupMutants:
			for _, m := range mutantFaults {
				p.faults[m] = true
			}
		case f == GroupEviction:
			for _, m := range EvictionFaults {
				p.faults[m] = true
			}
		case f == GroupMembers:
			for _, m := range MemberFaults {
				p.faults[m] = true
			}
		case slices.Contains(all, f):
			p.faults[f] = true
		default:
			return p, fmt.Errorf("%w: unknown fault %q (known: %s, %s, %s, %s, %s)", ErrConfig, f, GroupDefault, GroupMutants, GroupEviction, GroupMembers, strings.Join(all, ", "))
		}
	}
	seen := map[string]int{}
	for i := range cfg.Backends {
		b := &cfg.Backends[i]
		if b.URL == "" {
			return p, fmt.Errorf("%w: backend %d has no URL", ErrConfig, i+1)
		}
		if b.TTL < 0 || b.Slack < 0 {
			return p, fmt.Errorf("%w: backend %d: negative TTL or Slack", ErrConfig, i+1)
		}
		name := b.Name
		if name == "" {
			name = defaultName(b.URL)
			seen[name]++
			if n := seen[name]; n > 1 {
				name += "-" + strconv.Itoa(n)
			}
		}
		if slices.Contains(p.names, name) {
			return p, fmt.Errorf("%w: two backends named %q", ErrConfig, name)
		}
		p.names = append(p.names, name)
	}
	return p, nil
}

// defaultName is the report's name for a URL: the driver's name for its
// scheme where it is known, else the scheme.
func defaultName(raw string) string {
	s := strings.ToLower(scheme(raw))
	switch s {
	case "postgres", "postgresql":
		return "postgres"
	case "redis", "rediss", "redis+sentinel", "rediss+sentinel":
		return "redis"
	case "zk", "zookeeper":
		return "zookeeper"
	case "mongodb", "mongodb+srv":
		return "mongo"
	case "":
		return "backend"
	}
	return s
}

// scheme returns rawURL's scheme without parsing the rest (which may not
// parse, and whose errors could quote secrets).
func scheme(rawURL string) string {
	i := strings.Index(rawURL, "://")
	if i < 0 {
		i = strings.Index(rawURL, ":")
	}
	if i <= 0 {
		return ""
	}
	return strings.ToLower(rawURL[:i])
}

// openBackendEnv prepares a backend's cells: its URL, TTL, whether the
// proxy can front it, its own description and the expectations.
func openBackendEnv(ctx context.Context, b Backend, name, exe string, expect report.Table) (*backendEnv, error) {
	sch := scheme(b.URL)
	be := &backendEnv{name: name, scheme: sch, url: b.URL, ttl: b.TTL, slack: b.Slack, control: b.Control, exe: exe, proxy: !b.NoProxy, peer: b.Peer}
	if be.ttl == 0 {
		be.ttl = time.Second
		if sch == "etcd" {
			be.ttl = 2 * time.Second
		}
	}
	if be.slack == 0 {
		switch sch {
		case "etcd":
			be.slack = 700 * time.Millisecond
		case "zk":
			be.slack = 500 * time.Millisecond
		default:
			be.slack = 300 * time.Millisecond
		}
	}
	u, perr := url.Parse(b.URL)
	if perr != nil {
		return nil, errors.New("the URL does not parse: " + driver.RedactText(perr.Error(), b.URL))
	}
	switch {
	case b.NoProxy:
		be.noProxy = "Backend.NoProxy is set"
	case u.Host == "" || strings.Contains(u.Host, ","):
		be.proxy, be.noProxy = false, "the URL does not name exactly one host:port"
	case strings.Contains(sch, "sentinel"):
		be.proxy, be.noProxy = false, "the URL names a Sentinel, not the store"
	}
	if b.Peer != nil {
		if b.Peer.Lib == "" {
			return nil, errors.New("Backend.Peer.Lib is empty")
		}
		// The peer's contenders open the store with their library.
		be.proxy, be.noProxy = false, "a peer library's contenders connect to the store themselves"
		be.rules = slices.Concat(expect, expectations)
		return be, nil
	}
	if sch == "zk" {
		// The lock lives as long as the session: make it the TTL.
		q := u.Query()
		q.Set("session_timeout", be.ttl.String())
		u.RawQuery = q.Encode()
		be.url = u.String()
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	bk, opts, err := fencelock.OpenBackend(octx, be.url)
	if err != nil {
		return nil, errors.New("open: " + driver.RedactText(err.Error(), b.URL))
	}
	defer bk.Close()
	be.rules = slices.Concat(expect, expectations, primExpectations)
	_, waiter := bk.(driver.Waiter)
	_, watcher := driver.Watches(bk)
	be.waits = waiter || watcher
	_, bacq := bk.(driver.BatchAcquirer)
	_, brel := bk.(driver.BatchReleaser)
	switch {
	case !bacq || !brel:
		be.noBatch = "the backend does not batch acquisitions and releases (driver.BatchAcquirer, driver.BatchReleaser)"
	case opts != nil && opts.NoCoalesce:
		be.noBatch = "coalescing is turned off in the URL (coalesce=off)"
	default:
		be.batches = true
	}
	if d, ok := bk.(driver.Describer); ok {
		desc := d.Describe()
		be.claim = &desc
		be.rules = append(be.rules, claimedRules(name, desc)...)
	}
	return be, nil
}

// summary is one line per cell for the log.
func summary(c report.Cell) string {
	s := c.Result.Stats
	return fmt.Sprintf("%s/%s: %s in %v: %d rounds, %d acquisitions, %d writes (%d accepted), stale %d attempted / %d accepted, "+
		"detection margin p50 %v p99 %v, orphan p50 %v max %v, failed %v",
		c.Backend, c.Fault, c.Verdict, c.Duration, c.Rounds, s.Acquisitions, s.Writes, s.WritesAccepted,
		s.StaleAttempted, s.StaleAccepted, s.DetectionMargin.P50, s.DetectionMargin.P99, s.OrphanTime.P50, s.OrphanTime.Max,
		c.Result.Failed())
}

// saveHistory keeps a failed cell's history (in outDir/histories, or a
// temporary file) and returns the file's path, "" if none.
func saveHistory(outDir, backend, fault string, h history.History) string {
	if len(h) == 0 {
		return ""
	}
	var f *os.File
	var err error
	if outDir != "" {
		dir := filepath.Join(outDir, "histories")
		if err = os.MkdirAll(dir, 0o755); err == nil {
			f, err = os.Create(filepath.Join(dir, safeName(backend)+"-"+safeName(fault)+".jsonl"))
		}
	} else {
		f, err = os.CreateTemp("", "fencelock-safety-"+safeName(backend)+"-"+safeName(fault)+"-*.jsonl")
	}
	if err != nil {
		return ""
	}
	defer f.Close()
	enc := history.NewEncoder(f)
	for _, ev := range h {
		if enc.Encode(ev) != nil {
			return ""
		}
	}
	return f.Name()
}

// safeName keeps letters, digits, '-' and '_' of a name for a file name.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, s)
}

// writeReport writes safety.md and safety.json to dir.
func writeReport(dir string, rep report.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("suite: %w", err)
	}
	return WriteReport(filepath.Join(dir, "safety.md"), filepath.Join(dir, "safety.json"), rep)
}

// WriteReport writes rep as markdown to mdPath and as JSON to jsonPath.
func WriteReport(mdPath, jsonPath string, rep report.Report) error {
	var errs []error
	for _, out := range []struct {
		path  string
		write func(*os.File) error
	}{
		{mdPath, func(f *os.File) error { return report.WriteMarkdown(f, rep) }},
		{jsonPath, func(f *os.File) error { return report.WriteJSON(f, rep) }},
	} {
		f, err := os.Create(out.path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := out.write(f); err != nil {
			errs = append(errs, err)
		}
		if err := f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// randomSeed is a seed for a run without one: positive, below 2^53 (exact
// in JSON).
func randomSeed() int64 { return rand.Int64N(1<<53) + 1 }
