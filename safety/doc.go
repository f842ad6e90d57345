// Package safety is fencelock's fault-injection safety suite: it measures,
// per backend, what survives which fault, and generates the report in
// docs/safety.md.
//
// The package itself holds only tests; the harness and the scenarios are
// package safety/suite (suite.Run), which also runs the matrix against a
// team's own servers (and `fencelock safety` calls). TestSafety runs,
// through suite.Run, for every backend
// whose server is configured (FENCELOCK_TEST_POSTGRES, _REDIS, _ETCD,
// _ZOOKEEPER, _MONGO, _MONGO_PG; see scripts/testenv; unset means skipped, or failed
// under CI=true), one cell per fault class: three contender processes
// (safety/contender, started with safety/proc) take turns on two keys with
// a short TTL and write to a fenced resource (safety/fence) while the
// harness injects the fault — a holder paused (SIGSTOP, also between its
// lease check and its write) or killed (SIGKILL), its connection to the
// store cut, slowed, reset or losing one reply (internal/faultproxy), a
// stale release and renew of an old grant, the store killed and restarted
// or paused (servers started by scripts/testenv only), and for Redis a
// FLUSHALL, an early expiry of a lock key and eviction under four
// maxmemory-policy settings (on a Redis each cell starts). A PostgreSQL
// of the test's own, under libfaketime (row postgres-faketime), has its
// clock jump forward by 2×TTL while a lock is held. One more cell per backend,
// rotation-batch-wait, rotates tokens (the fence must accept each rotated
// token and then refuse the token before it), has every client hold
// several leases (batch renewal) and waits through the backend's Waiter
// or Watcher, with a rotating holder paused. Where the backend batches
// (driver.BatchAcquirer, BatchReleaser), coalesced runs three clients of
// 8 to 12 workers on 16 keys, so that a client's acquisitions and
// releases go to the store in batches, with a holder paused, then one
// killed. Six more run the primitives
// beyond the lock with the fenced resource in the loop: a semaphore of
// two permits (sem-baseline, sem-holder-pause, sem-holder-kill; writes
// fenced per permit slot, checked for S1 and S2 besides P1..P8) and a
// read-write lock (rw-baseline, rw-holder-pause, rw-holder-kill; reads
// and writes fenced by the grants' tokens, checked for W1..W3). Two more
// run the primitives of several keys and of upgrades: multi-holder
// (groups of 2 or 3 of 4 keys taken all or nothing, each key written
// with its own token, a group's holder paused then killed; checked for
// M1 besides P1..P8) and upgrade-holder (upgradeable reads that upgrade
// beside readers and writers, an upgraded writer paused then killed;
// checked for W1..W3 and U1). One more,
// mixed-config, runs clients of different options (TTL, RotateEvery,
// MinHold) on the same keys; on MongoDB, server-stall-clock-resync stops
// the store for 3s while the clients' clock resyncs are due. The
// call-bounds cell runs no contenders: the harness times its own calls
// (TryAcquire, Acquire, Release, Close, with and without deadlines)
// with the store paused, refusing connections or gone after Open,
// against the call-bound contract (B1), and checks that a failed call
// names the store's cause (B2). The dual
// backend of a migration (dual://, Redis and PostgreSQL) runs the
// rotation cell, a holder kill and sem-holder-kill. Then the loopback clusters
// (FENCELOCK_TEST_ETCD3, _ZOOKEEPER3, _REDISHA; started by the suite with
// scripts/testenv when unset) lose their leader or primary, and (etcd3,
// zookeeper3) have the member a holder is connected to paused, or
// isolated from its paused peers. Each cell's
// merged history is checked for P1..P8 (safety/check) and classified
// (safety/report). Negative controls (fencing off, four mutant backends
// over Redis or PostgreSQL) must be caught, and the test fails on any
// UNSAFE-UNEXPECTED cell.
//
// Run it (servers from scripts/testenv):
//
//	out=$(scripts/testenv up) && eval "$out"
//	cd safety && go test -race -run TestSafety -v
//
// The quick profile (the default, run by CI) takes about 8 minutes on two
// cores with -race, plus about 3 minutes for the semaphore and read-write
// cells (measured on a busy machine). Flags (after -args): -safety.seed=N reruns a run (every
// run logs its seed), -safety.soak runs the long profile (ten rounds of
// every fault, a minute of baseline; give go test a -timeout of an hour or
// two; -safety.rounds=N sets the rounds per fault, see
// docs/safety-soak.md), -safety.report=../docs/safety.md and -safety.json=../docs/safety.json
// write the report there (by default it goes to a temporary directory,
// whose path the test logs). A failed cell's history is kept in a
// temporary file named in the failure.
package safety
