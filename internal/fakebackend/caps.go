package fakebackend

import (
	"context"

	"github.com/fencelock/fencelock/driver"
)

//go:generate go run gen.go

// The parts a view is made of: core is the driver.Backend every view
// shows; each other part adds one optional capability. A view embeds
// core and the parts of its capabilities (views.go).
type (
	core          struct{ f *Fake }
	waiter        struct{ f *Fake }
	watcher       struct{ f *Fake }
	batchRenewer  struct{ f *Fake }
	lossNotifier  struct{ f *Fake }
	forceReleaser struct{ f *Fake }
	describer     struct{ f *Fake }
	tokenFloorer  struct{ f *Fake }
	guarantor     struct{ f *Fake }
	batchAcquirer struct{ f *Fake }
	batchReleaser struct{ f *Fake }
)

func (c core) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	return c.f.acquire(ctx, r)
}

func (c core) Renew(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error) {
	return c.f.renew(ctx, g, r)
}

func (c core) Release(ctx context.Context, g driver.Grant) error { return c.f.release(ctx, g) }

func (c core) Inspect(ctx context.Context, key string) (driver.Info, error) {
	return c.f.inspect(ctx, key)
}

func (c core) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	return c.f.list(ctx, prefix)
}

func (c core) Close() error { return c.f.close() }

func (c waiter) AcquireWait(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	return c.f.acquireWait(ctx, r)
}

func (c watcher) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	return c.f.watch(ctx, key)
}

func (c batchRenewer) RenewBatch(ctx context.Context, gs []driver.Grant, r driver.RenewRequest) ([]driver.RenewResult, error) {
	return c.f.renewBatch(ctx, gs, r)
}

func (c lossNotifier) NotifyLoss(g driver.Grant, lost func(error)) (stop func()) {
	return c.f.notifyLoss(g, lost)
}

func (c forceReleaser) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	return c.f.forceRelease(ctx, key)
}

func (c describer) Describe() driver.Description { return c.f.describe() }

func (c tokenFloorer) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	return c.f.highWater(ctx, prefix)
}

func (c tokenFloorer) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	return c.f.raiseFloor(ctx, key, floor)
}

func (c guarantor) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	return c.f.guarantees(ctx)
}

func (c batchAcquirer) AcquireBatch(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	return c.f.acquireBatch(ctx, reqs)
}

func (c batchReleaser) ReleaseBatch(ctx context.Context, gs []driver.Grant) ([]error, error) {
	return c.f.releaseBatch(ctx, gs)
}
