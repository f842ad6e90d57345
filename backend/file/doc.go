// Package file is fencelock's embedded backend: locks shared by every
// process on one machine, kept in a directory of small files, with no server
// to install. It is the default of the fencelock command.
//
//	b, err := file.New(ctx, &file.Options{Dir: "/var/lib/myapp/locks"})
//	c, err := fencelock.New(b, nil)
//
// or, by URL, after importing the package (its init registers the scheme):
//
//	c, err := fencelock.Open(ctx, "file:///var/lib/myapp/locks", nil)
//
// # URLs
//
// Open, OpenURL and fencelock.Open take
//
//	file:///path/to/dir           an absolute directory
//	file://localhost/path/to/dir  the same
//	file://                       DefaultDir()
//	file:relative/dir             relative to the working directory
//
// for example
//
//	file:///var/lib/myapp/locks?sync=false
//
// The scheme is case-insensitive. The directory is Options.Dir, created
// if missing as New does. The one parameter is sync (default true;
// sync=false sets Options.NoSync). Any other parameter is an error, and
// so are a host other than localhost (the backend is local to one
// machine) and a user or password: a file URL carries no credentials, so
// there is nothing to redact, and a URL refused for carrying them is
// shown through driver.RedactURL all the same. fencelock.Open also accepts
// the engine's parameters (ttl, renew_interval, margin, rotate_every,
// owner) and removes them before this package sees the URL.
//
// # Design
//
// Each key has one file in the directory, <sha256 of the key>.json, so any
// valid key is a safe file name; the raw key is stored inside and checked
// on every read. The file holds the key's holder, token and expiry, the
// holder's metadata ("meta", base64, absent when there is none: files
// written by earlier versions read as records without metadata, and
// earlier versions ignore the field), and "last", the highest token ever
// issued for the key. It is created on the key's first use and never
// removed or replaced, so it can also be the target of flock(2).
//
// Every change takes an exclusive flock(2) on the key's file (through its
// own open file description, so goroutines of one process exclude each
// other as separate processes do), reads the state, overwrites it in place
// with a single write at offset 0 (padded with spaces to the file's length,
// so no truncation is ever needed), and closes the file, which drops the
// flock. A process killed at any point leaves the old state or the new one,
// and its flock dies with it. Inspect and List read under a shared flock.
// When a change issued a token (an acquire, a rotation) the file is synced
// to disk (fdatasync on Linux; the file is padded to 512 bytes so its size
// rarely changes, and the sync costs no journal commit) before the flock is
// dropped, and for a new file the directory too: the token counter is the only state that
// must survive a power failure, since every holder dies with the machine
// and a record from a previous boot counts as expired. Renewals and
// releases therefore cost no sync. (Replacing the file by rename would
// cost a data flush on ext4 for every renewal, milliseconds on a busy
// disk.) Waiting for a flock is bounded by the caller's context: it is tried
// without blocking and retried every few hundred microseconds, and it is
// only ever held for one read-modify-write, never while a lock is held.
//
// # Guarantees
//
// Mutual exclusion holds between every process and goroutine that uses the
// same directory on one machine. The directory must be on a local file
// system: flock(2) over NFS is not reliable, and processes on different
// machines do not share a clock (Describe warns about NFS).
//
// Expiry is judged by the machine's CLOCK_MONOTONIC on Linux: one clock
// shared by every process, the very clock the engine's local-validity timers
// run on (so holder and store agree exactly, with no drift), and one that a
// wall-clock step (NTP, date -s) does not move. Expiry times are stored
// together with the kernel's boot id (/proc/sys/kernel/random/boot_id):
// CLOCK_MONOTONIC restarts at boot, and a record written before a reboot
// belongs to a process that no longer exists, so it counts as expired. On
// other Unix systems, and on Linux without a readable boot id, expiry is
// judged by the wall clock (CLOCK_REALTIME), which is still one clock for
// every process of the machine, but a wall-clock step forward can end a
// lease early in the store's eyes while its holder still believes in it
// (Describe reports which clock is in use).
//
// Fencing tokens come from the per-key "last" counter in the .json file,
// which is never deleted (release and force-release keep it). Each new token
// is max(last+1, wall-clock microseconds since 1970): strictly increasing
// while the file exists, and still increasing if the directory is wiped
// (the default directory is on tmpfs on many systems, emptied at reboot) or
// the counter is lost to a power failure with NoSync, as long as the wall
// clock has not been set back. Tokens are therefore large numbers (about
// 1.8e15 in 2026), which fit a signed 64-bit column.
//
// Token floors (driver.TokenFloorer, for migrations between backends):
// RaiseFloor raises one key's "last" counter, never lowers it, under the
// key's flock and synced like an issued token, so the key's next token is
// above the floor; HighWater lists every key's counter. There is no
// global floor: a key whose file does not exist yet gets its floor only
// when it is raised by name. Floors are below 2^63-1; a key whose counter
// reached 2^63-1 issues no more tokens (ErrTokenOverflow) rather than
// leave the signed 64-bit range.
//
// A crashed holder's lock is freed by its TTL. Renew never creates a
// record; Acquire by the record's own owner succeeds and returns the
// existing grant; Release and Renew check owner and token.
//
// # Costs and caveats
//
// An operation costs a few small file-system calls (tens of microseconds);
// one that issues a token adds a data sync (about half a millisecond on a
// busy virtual disk).
// That suits command-line use and services with up to a few thousand
// leases; one directory is not meant for thousands of acquisitions per
// second.
//
// One file per key ever used stays in the directory: it holds the key's
// token counter. Removing files is safe only while no process uses the
// directory at all (a process may have the file open and flocked); tokens
// of a removed key continue from the wall-clock floor. A state file damaged
// by a power failure during a write reads as a free key whose counter was
// lost (no holder survived the failure; tokens continue from the wall-clock
// floor).
//
// Locks are per user by default: the default directory is private to the
// current user ($XDG_RUNTIME_DIR/fencelock, or $TMPDIR/fencelock-UID), and
// New refuses it if another user owns it or can write to it. To share locks
// between users, point them at one directory they can all write.
//
// On Linux the Backend is also a driver.Watcher: a waiting contender
// watches the key's file with inotify(7) and retries as soon as the file is
// written (a release; renewals cause spurious wake-ups, which are cheap).
// Elsewhere, and when the per-user inotify limit is reached, the engine
// polls with capped backoff (at most Options.MaxBackoff, 1s by default, and
// never past the holder's expiry). The file backend needs flock(2): Linux,
// macOS and the BSDs. On other systems (Windows) the package compiles and
// New returns an error matching driver.ErrUnsupported.
package file
