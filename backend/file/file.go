//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package file

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// Backend is a connection to one lock directory. It implements
// driver.Backend, driver.BatchRenewer, driver.ForceReleaser,
// driver.TokenFloorer (per key) and driver.Describer, and on Linux
// driver.Watcher (inotify). Any number of Backends, in any number of processes, may
// use the same directory.
type Backend struct {
	dir     string
	sync    bool
	clk     clock
	closed  atomic.Bool
	warning []string

	// Watches (Linux only): open inotify instances and their goroutines.
	mu      sync.Mutex
	watches map[*os.File]struct{}
	wg      sync.WaitGroup
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// New opens the lock directory named by opts (nil means defaults), creating
// it if needed. The default directory must be owned by the current user and
// writable by nobody else; New refuses one that is not (or that is a
// symbolic link), since it lives in a shared place such as /tmp. New's work
// is a few local system calls: it returns ctx's error if ctx has already
// ended, and is not interrupted by ctx after that.
func New(ctx context.Context, opts *Options) (*Backend, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	dflt := o.Dir == ""
	if dflt {
		o.Dir = DefaultDir()
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, &driver.InvalidOptionError{Option: "Dir", Value: o.Dir, Reason: err.Error()}
	}
	perm := fs.FileMode(0o777)
	if dflt {
		perm = 0o700
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return nil, fmt.Errorf("file: lock directory: %w", err)
	}
	if dflt {
		if err := checkPrivate(dir); err != nil {
			return nil, err
		}
	} else if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("file: lock directory: %w", err)
	} else if !fi.IsDir() {
		return nil, &driver.InvalidOptionError{Option: "Dir", Value: dir, Reason: "not a directory"}
	}
	b := &Backend{dir: dir, sync: !o.NoSync, clk: systemClock()}
	b.warning = append(b.warning, fsWarnings(dir)...)
	if !b.clk.monotonic {
		b.warning = append(b.warning, "expiry is judged by the wall clock (CLOCK_REALTIME): a clock step forward can end a lease early in the store's eyes while its holder still believes in it")
	}
	if o.NoSync {
		b.warning = append(b.warning, "sync=false: a power failure may lose token counters; tokens keep increasing only through the wall-clock floor")
	}
	return b, nil
}

// checkPrivate makes sure the default directory, which lives in a place
// other users can write to, is really ours.
func checkPrivate(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("file: lock directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return &driver.InvalidOptionError{Option: "Dir", Value: dir, Reason: "the default lock directory is a symbolic link; remove it or choose a directory"}
	case !fi.IsDir():
		return &driver.InvalidOptionError{Option: "Dir", Value: dir, Reason: "not a directory"}
	case ok && int(st.Uid) != os.Getuid():
		return &driver.InvalidOptionError{Option: "Dir", Value: dir, Reason: fmt.Sprintf("the default lock directory is owned by uid %d, not by the current user (uid %d)", st.Uid, os.Getuid())}
	case fi.Mode().Perm()&0o022 != 0:
		return &driver.InvalidOptionError{Option: "Dir", Value: dir, Reason: fmt.Sprintf("the default lock directory has mode %v: others can write to it", fi.Mode().Perm())}
	}
	return nil
}

// Dir returns the lock directory's absolute path.
func (b *Backend) Dir() string { return b.dir }

// state is the content of a key's .json file.
type state struct {
	Key   string `json:"key"`
	Last  uint64 `json:"last"`            // highest token ever issued for Key
	Owner string `json:"owner,omitempty"` // empty: free
	Token uint64 `json:"token,omitempty"`
	// Expires is the clock reading (nanoseconds) at which the record
	// expires, in the clock domain Clock ("monotonic/<boot id>" or
	// "realtime"). A record of another domain belongs to a previous boot.
	Expires int64  `json:"expires,omitempty"`
	Clock   string `json:"clock,omitempty"`
	// Meta is the holder's metadata payload (driver.AcquireRequest.Metadata),
	// base64 in the file; absent when there is none, as in files written
	// before metadata existed, which read as a record without it.
	Meta []byte `json:"meta,omitempty"`
}

func (s *state) live(now reading) bool {
	return s.Owner != "" && s.Clock == now.domain && now.ns < s.Expires
}

func (s *state) info(now reading) driver.Info {
	return driver.Info{Key: s.Key, Owner: s.Owner, Token: driver.Token(s.Token), Remaining: time.Duration(s.Expires - now.ns), Metadata: clone(s.Meta)}
}

// clone copies a metadata payload; nil and empty both become nil.
func clone(md []byte) []byte {
	if len(md) == 0 {
		return nil
	}
	return append([]byte(nil), md...)
}

// ErrTokenOverflow reports that a key's token counter is at 2^63-1, the
// largest signed 64-bit integer, so no higher token can be issued: Acquire
// and rotating renewals of the key are refused and change nothing (a
// rotation refused leaves the grant's token and expiry as they were).
// Errors matching it also match driver.ErrUnsupported, so the engine takes
// them as an answer and does not retry. Counters that follow the wall
// clock never get there; only a floor raised near 2^63-1 (a migration)
// could.
var ErrTokenOverflow = errors.New("file: token counter at 2^63-1")

// overflowError is the error for key's counter at 2^63-1.
type overflowError struct{ key string }

func (e *overflowError) Error() string {
	return fmt.Sprintf("file: the token counter of %q is at 2^63-1, the largest signed 64-bit integer: no higher token can be issued", e.key)
}

// Is matches ErrTokenOverflow and driver.ErrUnsupported.
func (e *overflowError) Is(target error) bool {
	return target == ErrTokenOverflow || target == driver.ErrUnsupported
}

// next issues a token: max(last+1, wall-clock microseconds). It refuses
// (changing nothing) once last is 2^63-1: tokens never leave the signed
// 64-bit range.
func (s *state) next() (uint64, error) {
	if s.Last >= math.MaxInt64 {
		return 0, &overflowError{key: s.Key}
	}
	t := s.Last + 1
	if floor := uint64(time.Now().UnixMicro()); floor > t {
		t = floor
	}
	s.Last = t
	return t, nil
}

func (s *state) clear() {
	s.Owner, s.Token, s.Expires, s.Clock, s.Meta = "", 0, 0, "", nil
}

func fileName(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

func (b *Backend) check(ctx context.Context) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return ctx.Err()
}

// lockFile opens a key's state file and takes a flock on it (exclusive
// for an update, shared for a read), waiting for it no longer than ctx
// allows. With create false, a missing file returns (nil, nil). The caller
// closes the file, which drops the flock.
func (b *Backend) lockFile(ctx context.Context, name string, exclusive, create bool) (*os.File, error) {
	flag, how := os.O_RDONLY, syscall.LOCK_SH
	if exclusive {
		flag, how = os.O_RDWR, syscall.LOCK_EX
	}
	if create {
		flag |= os.O_CREATE
	}
	f, err := os.OpenFile(filepath.Join(b.dir, name+".json"), flag|syscall.O_CLOEXEC, 0o666)
	if !create && errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("file: %w", err)
	}
	fd := int(f.Fd())
	wait := 50 * time.Microsecond
	for {
		err := syscall.Flock(fd, how|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if err != syscall.EWOULDBLOCK && err != syscall.EINTR {
			f.Close()
			return nil, fmt.Errorf("file: flock %s: %w", f.Name(), err)
		}
		// Another process or goroutine is in the middle of one
		// read-modify-write of this key: wait for that (microseconds),
		// not for a lock holder.
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Millisecond)
	}
}

// readState reads a key's state from its locked file. An empty file is a
// fresh key. A file that does not parse can only be the result of a
// power failure during a write (a process killed mid-write cannot tear a
// single small write), after which no holder is alive: it reads as a free
// key whose counter was lost, and tokens continue from the wall-clock
// floor.
func readState(f *os.File, key string) (st state, size int64, err error) {
	fi, err := f.Stat()
	if err != nil {
		return state{}, 0, fmt.Errorf("file: %w", err)
	}
	buf := make([]byte, fi.Size())
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		return state{}, 0, fmt.Errorf("file: %w", err)
	}
	st = state{Key: key}
	buf = bytes.TrimSpace(buf)
	if len(buf) == 0 {
		return st, fi.Size(), nil
	}
	var s state
	if json.Unmarshal(buf, &s) != nil {
		return st, fi.Size(), nil
	}
	if s.Key != key {
		return state{}, 0, fmt.Errorf("file: state file %s belongs to key %q, not %q", f.Name(), s.Key, key)
	}
	return s, fi.Size(), nil
}

// minRecord is the size a state file is padded to, so that the file's size
// rarely changes after its creation: then an fdatasync needs no journal
// commit, only the data block.
const minRecord = 512

// writeState overwrites the state in place with one write at offset 0,
// padded with spaces to the file's current size so that no truncation is
// needed: the file holds the old state or the new one, never a mix. (A
// rename-based replacement costs a flush on ext4; this costs one write.)
// With durable (a token was issued) and unless NoSync, the data is synced
// (fdatasync on Linux), and the directory too when the file is new.
func (b *Backend) writeState(f *os.File, s *state, size int64, durable bool) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return err
	}
	for int64(buf.Len()) < max(size, minRecord) {
		buf.WriteByte(' ')
	}
	_, err := f.WriteAt(buf.Bytes(), 0)
	if err == nil && durable && b.sync {
		err = datasync(f)
		if err == nil && size == 0 {
			err = syncDir(b.dir)
		}
	}
	if err != nil {
		return fmt.Errorf("file: writing state: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// update runs fn on key's state under an exclusive flock and writes the
// state back if fn reports a change. The write is made durable when fn
// issued a token: only the counter needs to survive a power failure (every
// holder dies with the machine, and a record of a previous boot counts as
// expired), so renewals and releases cost no sync.
//
// Only Acquire creates a key's file (create); for the other operations a
// missing file is a key never used, which fn sees as a free state, and the
// open never takes the directory's lock as O_CREAT would.
func (b *Backend) update(ctx context.Context, key string, create bool, fn func(s *state, now reading) (changed bool, err error)) error {
	name := fileName(key)
	f, err := b.lockFile(ctx, name, true, false)
	if f == nil && err == nil && create {
		f, err = b.lockFile(ctx, name, true, true)
	}
	if err != nil {
		return err
	}
	s, size := state{Key: key}, int64(0)
	if f != nil {
		defer f.Close()
		s, size, err = readState(f, key)
		if err != nil {
			return err
		}
	}
	last := s.Last
	changed, err := fn(&s, b.clk.now())
	if err != nil || !changed {
		return err
	}
	if f == nil {
		return errors.New("file: internal error: change to a key without a file")
	}
	return b.writeState(f, &s, size, s.Last != last)
}

// load reads key's state under a shared flock; a key never used is free.
func (b *Backend) load(ctx context.Context, key, name string) (state, error) {
	f, err := b.lockFile(ctx, name, false, false)
	if err != nil || f == nil {
		return state{Key: key}, err
	}
	defer f.Close()
	s, _, err := readState(f, key)
	return s, err
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	var g driver.Grant
	err := b.update(ctx, req.Key, true, func(s *state, now reading) (bool, error) {
		if s.live(now) && s.Owner != req.Owner {
			return false, &driver.HeldError{Holder: s.info(now)}
		}
		if left := s.Expires + int64(req.LockDelay) - now.ns; req.LockDelay > 0 && s.Owner != "" && s.Owner != req.Owner && s.Clock == now.domain && left > 0 {
			// Expired, not released (a release clears the owner): the
			// key stays refused for the lock delay after the expiry, by
			// the same clock. A record of an earlier boot is past it.
			return false, &driver.HeldError{Holder: driver.Info{Key: req.Key, Token: driver.Token(s.Token)}, LockDelay: time.Duration(left)}
		}
		if !s.live(now) {
			t, err := s.next()
			if err != nil {
				return false, err
			}
			s.Owner, s.Token, s.Clock = req.Owner, t, now.domain
		}
		// Otherwise a retry by the holder: same grant. Either way a fresh
		// expiry and this request's metadata.
		s.Expires = now.ns + int64(req.TTL)
		s.Meta = clone(req.Metadata)
		g = driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(s.Token)}
		return true, nil
	})
	if err != nil {
		return driver.Grant{}, err
	}
	return g, nil
}

// Renew implements driver.Backend.
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	if driver.ValidateKey(g.Key) != nil {
		return driver.Grant{}, driver.ErrNotHeld
	}
	err := b.update(ctx, g.Key, false, func(s *state, now reading) (bool, error) {
		if !s.live(now) || s.Owner != g.Owner || s.Token != uint64(g.Token) {
			return false, driver.ErrNotHeld
		}
		if req.Rotate {
			t, err := s.next()
			if err != nil {
				return false, err
			}
			s.Token = t
		}
		if req.SetMetadata {
			s.Meta = clone(req.Metadata) // under the same flock as the holder check above
		}
		s.Expires = now.ns + int64(req.TTL)
		g.Token = driver.Token(s.Token)
		return true, nil
	})
	if err != nil {
		return driver.Grant{}, err
	}
	return g, nil
}

// renewWorkers bounds the goroutines RenewBatch uses. Renewals of
// different keys are independent; running a few at once keeps a batch short
// when file-system calls wait (a journal commit forced by another process's
// fsync delays every write on ext4).
const renewWorkers = 8

// RenewBatch implements driver.BatchRenewer. The grants are renewed by up
// to renewWorkers goroutines, each under its own key's flock, all finished
// before RenewBatch returns; a failure of one does not stop the others.
// It keeps every record's metadata (req.SetMetadata is ignored).
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	req.SetMetadata, req.Metadata = false, nil
	out := make([]driver.RenewResult, len(grants))
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	work := func() {
		defer wg.Done()
		for {
			i := int(next.Add(1)) - 1
			if i >= len(grants) {
				return
			}
			if err := ctx.Err(); err != nil {
				out[i].Err = err // out of time: the engine retries these
				continue
			}
			out[i].Grant, out[i].Err = b.Renew(ctx, grants[i], req)
		}
	}
	n := min(renewWorkers, len(grants))
	wg.Add(n)
	for range n - 1 {
		go work()
	}
	work()
	wg.Wait()
	return out, nil
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if driver.ValidateKey(g.Key) != nil {
		return driver.ErrNotHeld
	}
	return b.update(ctx, g.Key, false, func(s *state, now reading) (bool, error) {
		if !s.live(now) || s.Owner != g.Owner || s.Token != uint64(g.Token) {
			return false, driver.ErrNotHeld
		}
		s.clear()
		return true, nil
	})
}

// ForceRelease implements driver.ForceReleaser: it removes key's record
// whoever holds it and returns what it removed. The token counter stays, so
// the next grant still gets a higher token; the holder finds out at its next
// renewal.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	info := driver.Info{Key: key}
	err := b.update(ctx, key, false, func(s *state, now reading) (bool, error) {
		if !s.live(now) {
			return false, nil
		}
		info = s.info(now)
		s.clear()
		return true, nil
	})
	if err != nil {
		return driver.Info{}, err
	}
	return info, nil
}

// Inspect implements driver.Backend. It reads without taking the flock.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	s, err := b.load(ctx, key, fileName(key))
	if err != nil {
		return driver.Info{}, err
	}
	if now := b.clk.now(); s.live(now) {
		return s.info(now), nil
	}
	return driver.Info{Key: key}, nil
}

// List implements driver.Backend: it reads every state file in the
// directory (without taking flocks) and returns the live records whose key
// starts with prefix, sorted by key. Its cost grows with the number of keys
// ever used in the directory.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, fmt.Errorf("file: %w", err)
	}
	now := b.clk.now()
	var out []driver.Info
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || len(name) != 2*sha256.Size || !e.Type().IsRegular() {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s, err := b.loadAny(ctx, name)
		if err != nil {
			return nil, err
		}
		if s.live(now) && strings.HasPrefix(s.Key, prefix) {
			out = append(out, s.info(now))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// loadAny reads the state file with the given name, whatever its key;
// the zero state if it is missing, empty, damaged, or not named after its
// key.
func (b *Backend) loadAny(ctx context.Context, name string) (state, error) {
	f, err := b.lockFile(ctx, name, false, false)
	if err != nil || f == nil {
		return state{}, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return state{}, fmt.Errorf("file: %w", err)
	}
	var s state
	if json.Unmarshal(bytes.TrimSpace(data), &s) != nil || fileName(s.Key) != name {
		return state{}, nil
	}
	return s, nil
}

// Describe implements driver.Describer.
func (b *Backend) Describe() driver.Description {
	clock := "the machine's CLOCK_MONOTONIC (the clock of the holders' own timers), scoped to the current boot"
	if !b.clk.monotonic {
		clock = "the machine's wall clock (CLOCK_REALTIME), shared by every process on it"
	}
	fencing := "per-key counter in a file, written in place under flock(2)"
	if b.sync {
		fencing += " and synced to disk when a token is issued"
	}
	fencing += "; each token is max(previous+1, wall-clock µs), so tokens also survive a wiped directory unless the wall clock goes back"
	return driver.Description{
		Name:          "file",
		Fencing:       fencing,
		Clock:         clock,
		Liveness:      "TTL (flock(2) is held only for each read-modify-write, never while a lock is held)",
		Scope:         driver.ScopeKey,
		Failover:      "one machine: records and counters are fsynced, so they survive a crash of the machine, not the loss of its disk",
		LossDetection: driver.LossByRenewal,
		Warnings:      append([]string(nil), b.warning...),
	}
}

// Close implements driver.Backend. The Backend holds no open files between
// calls; Close ends any watches (and their goroutines) and marks it closed.
func (b *Backend) Close() error {
	b.mu.Lock()
	b.closed.Store(true)
	b.mu.Unlock()
	b.closeWatches()
	return nil
}
