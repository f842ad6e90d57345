// Package fencelock provides distributed locks that are safe to build on:
// every lock is a lease with a fencing token issued by the store, one engine
// renews leases and notices their loss, and the same conformance suite
// proves each backend's behaviour.
//
// A Client wraps one Backend (PostgreSQL, Redis, etcd, ZooKeeper, MongoDB,
// a file directory, the in-process memory backend, or a third party's),
// chosen by URL with Open. Acquire and TryAcquire return a *Lease, which
// carries a fencing Token, renews itself in the background, and reports its
// end through Done, Context and Err. A first program (the README's):
//
//	package main
//
//	import (
//		"context"
//		"log"
//
//		"github.com/fencelock/fencelock"
//		_ "github.com/fencelock/fencelock/backend/redis" // registers redis://
//	)
//
//	// reports stands in for the resource the lock protects: a database or an
//	// API that remembers the highest token it has accepted (docs/fencing.md).
//	var reports fencelock.Fence
//
//	func main() {
//		ctx := context.Background()
//		c, err := fencelock.Open(ctx, "redis://localhost:6379/0", nil)
//		if err != nil {
//			log.Fatal(err)
//		}
//		defer c.Close()
//
//		lease, err := c.Acquire(ctx, "reports/daily") // waits until held or ctx ends
//		if err != nil {
//			log.Fatal(err)
//		}
//		defer lease.Release(ctx)
//
//		// Work under lease.Context(): it is cancelled the moment the lease is
//		// lost. Every write carries the token; a stale holder's is refused.
//		if err := reports.Check("reports/daily", lease.Token(), lease.Owner()); err != nil {
//			log.Fatal(err) // errors.Is(err, fencelock.ErrStaleToken)
//		}
//		log.Printf("wrote the daily report with token %d", lease.Token())
//	}
//
// # Safety
//
// A lease is judged by its holder's own monotonic clock: the engine starts
// the clock before each acquire or renew request is sent, and when
// start + TTL − Margin passes without a successful renewal the lease is
// over, even if the backend cannot be reached. Because the store counts its
// TTL from when it received the request, the holder stops believing it
// holds the lock before anyone else can acquire it (as long as clocks run at
// about the same rate; Margin absorbs the drift). A renewal answered "not
// yours" ends the lease at once; transient failures are retried until local
// validity runs out.
//
// Even so, a holder can be paused (GC, swap, SIGSTOP) between checking its
// lease and using the resource. Fencing tokens close that gap: tokens
// strictly increase per key, and a resource that remembers the highest
// token it has seen (see Fence) rejects the paused holder's late write.
package fencelock
