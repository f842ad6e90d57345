package pgfence

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock"
)

// DefaultCheckTimeout bounds a Checker's check when Checker.Timeout is 0.
const DefaultCheckTimeout = 10 * time.Second

// Checker applies the fencing rule in PostgreSQL for a server middleware
// that checks each request before its handler runs: kit/httpfence's
// Middleware and kit/grpc's Server take it as their Checker. Each check
// is a short transaction of its own that calls the fencing function
// (fencelock_fence for DefaultTable) and commits: accepted, the token and
// holder are recorded in the fence table; refused, it returns a
// *fencelock.StaleTokenError (which matches fencelock.ErrStaleToken) and
// records nothing.
//
// When to use it: every replica of a service behind a load balancer that
// checks through a Checker on one fence table shares one fence, so a
// token one replica has accepted refuses an older holder at every other
// replica — which replicas each with their own in-memory fencelock.Fence
// do not. But the check and the handler's write are then two steps: the
// middleware's per-resource lock serializes them within one process only.
// Across processes an older holder checked first can still write after a
// newer holder's write, if its handler is slow. So:
//
//   - if the handler writes to this same PostgreSQL database, write in
//     Tx (or SQLTx) with the request's token and holder, which checks and
//     writes in one transaction, and treat the middleware's check as the
//     early refusal (with kit/grpc, set Server.Concurrent then);
//   - if the service runs as one process, the middleware's lock makes the
//     check and the write one step, whatever the handler writes to, and
//     the Checker keeps the fence across restarts;
//   - with several processes writing anywhere other than this database,
//     neither the Checker nor the middleware makes the write safe: the
//     resource itself must apply the rule (docs/fencing.md).
//
// A Checker is safe for concurrent use; its zero Fences is DefaultTable.
// A token above 2^63-1 is a *TokenRangeError (the middlewares answer it
// as a failed check, not as a refusal).
type Checker struct {
	// DB begins the check's transaction: a *pgxpool.Pool, say. Required.
	DB Beginner
	// Fences is the fence table and its function; the zero value is
	// DefaultTable.
	Fences Fences
	// Timeout bounds each check, waiting for a fence row another
	// transaction holds included; 0 means DefaultCheckTimeout. A check
	// that runs out of time returns an error that is not a refusal (the
	// middlewares answer 503 Service Unavailable, or gRPC's Unavailable),
	// and its transaction rolls back.
	Timeout time.Duration
}

// Checker returns a Checker on f's table that begins its transactions on
// db.
func (f Fences) Checker(db Beginner) Checker { return Checker{DB: db, Fences: f} }

// Check applies the rule to a write of resource carrying token from
// holder, in a transaction of its own bounded by Timeout: nil if accepted
// (and recorded), a *fencelock.StaleTokenError if refused, another error
// if the check could not be made.
func (c Checker) Check(resource string, token fencelock.Token, holder string) error {
	return c.CheckContext(context.Background(), resource, token, holder)
}

// CheckContext is Check, ending also when ctx does (the request's
// context, so that a check is abandoned when its client goes away). The
// middlewares of kit/httpfence and kit/grpc call it, rather than Check,
// with the request's context. If ctx ends while the transaction commits,
// whether the token was recorded is unknown; a recorded token only
// refuses older ones, which is safe.
func (c Checker) CheckContext(ctx context.Context, resource string, token fencelock.Token, holder string) error {
	if c.DB == nil {
		panic("pgfence: Checker.DB is nil: set it to the *pgxpool.Pool whose database holds the fence table")
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.Fences.Tx(ctx, c.DB, resource, token, holder, func(pgx.Tx) error { return nil })
}
