package etcd

import (
	"context"
	"errors"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// leaseGrants is an etcd client's Lease that notes the id of every lease
// granted.
type leaseGrants struct {
	clientv3.Lease
	mu  sync.Mutex
	ids []clientv3.LeaseID
}

func (l *leaseGrants) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := l.Lease.Grant(ctx, ttl)
	if err == nil {
		l.mu.Lock()
		l.ids = append(l.ids, resp.ID)
		l.mu.Unlock()
	}
	return resp, err
}

func (l *leaseGrants) granted() []clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]clientv3.LeaseID(nil), l.ids...)
}

// A Close that runs whole while a grant is answered but not yet recorded
// by its session (found by a read-only review, present since the session
// checked closed before taking its lock): Close collects the sessions'
// ids, finds none, and revokes nothing. The session must see closed when
// it records the grant: the Acquire fails with ErrClosed, and the lease
// is revoked rather than kept, with the entry put on it, for its TTL
// after Close returned.
func TestCloseDuringAGrantLeavesNoLease(t *testing.T) {
	ctx := ctxT(t)
	base := open(t)
	var gl *leaseGrants
	b := onClient(t, base, func(cli *clientv3.Client) {
		gl = &leaseGrants{Lease: cli.Lease}
		cli.Lease = gl
	})
	var once sync.Once
	b.testHookLeaseAnswered = func() { once.Do(func() { _ = b.Close() }) }
	g, err := b.Acquire(ctx, lockReq("close-during-grant", "h1"))
	if !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Acquire while Close ran = %+v, %v; want ErrClosed", g, err)
	}
	ids := gl.granted()
	if len(ids) == 0 {
		t.Fatal("no lease was granted")
	}
	for _, id := range ids {
		ttl, err := base.cli.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL > 0 {
			t.Errorf("lease %x granted while Close ran lives on after it (TTL %ds left); want it revoked", int64(id), ttl.TTL)
		}
	}
}
