// Package peers measures other Go lock libraries under the safety
// suite's faults, for the comparison table of docs/safety-peers.md:
// go-redsync/redsync, bsm/redislock, etcd's concurrency.Mutex and
// go-zookeeper's zk.Lock.
//
// It is a Go module of its own, so that these libraries stay out of the
// graph of the safety module and of every module a user imports. The
// harness is the safety suite's (suite.Run with a suite.Peer backend):
// the same cells, faults, fenced resource, checker and verdicts as
// fencelock's rows. Only the contender program differs: MainIfContender
// runs, in a re-executed test binary, a contender that takes its locks
// with the library's own API and defaults and reports the same history
// events as fencelock's contender (safety/contender):
//
//   - acquire_start, then acquired (with the library's fencing token where
//     it has one) or acquire_failed;
//   - before every write, belief: the holder checks what the library lets
//     it check (a local deadline for redsync and redislock, the session
//     for concurrency.Mutex and zk.Lock) and reports how long it still
//     believes (Until);
//   - the write to the fenced resource, with the token (0 without one);
//   - lost, when the library tells the holder its lock is gone (redsync
//     and redislock: the deadline passed; concurrency.Mutex: the session
//     ended; zk.Lock: the session expired);
//   - release_start and released around the library's unlock.
//
// It obeys the harness's commands pause_before_write (stop itself between
// its check and its write) and stop.
package peers
