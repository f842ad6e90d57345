package zookeeper_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
	"github.com/go-zookeeper/zk"
)

// multiForm is raw grown step by step into the backend's acquiring request
// (backend/zookeeper/queue.go, enqueue): the create alone inside a multi;
// with the version-free SetData of the key's parent that gives the
// request its stat (the zxid that is the token, the number of children
// that says whether the contender is first); with the version check of the
// token floor's znode on top (the offset in force at that zxid). The
// release is raw's delete. steps is how many of the three operations to
// send.
func multiForm(name string, steps int) benchkit.Lib {
	return benchkit.Lib{Name: name, Setup: func(b *testing.B) benchkit.Lockers {
		e := setup(b)
		c := e.conn(b)
		floor := e.root + "/floor"
		if err := ensure(c, floor); err != nil {
			b.Fatal(err)
		}
		var parents sync.Map
		return benchkit.Same(func(_ context.Context, key string) (func() error, error) {
			parent, err := ensureParent(c, &parents, e.root+"/"+key)
			if err != nil {
				return nil, err
			}
			ops := []any{&zk.CreateRequest{Path: parent + "/lock-", Data: []byte("owner"), Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeralSequential}}
			if steps >= 2 {
				ops = append(ops, &zk.SetDataRequest{Path: parent, Data: nil, Version: -1})
			}
			if steps >= 3 {
				ops = append(ops, &zk.CheckVersionRequest{Path: floor, Version: 0})
			}
			res, err := c.Multi(ops...)
			if err != nil {
				return nil, err
			}
			p := res[0].String
			return func() error { return c.Delete(p, -1) }, nil
		}, nil)
	}}
}

// backendShared is the backend's Acquire and Release alone, on one
// backend (one session) for every goroutine, as raw has.
var backendShared = benchkit.BackendLib("fencelock-backend-shared", true, sessTO, func(b *testing.B) func() (driver.Backend, error) {
	e := setup(b)
	return func() (driver.Backend, error) {
		be, _, err := fencelock.OpenBackend(context.Background(), e.url)
		return be, err
	}
})

// BenchmarkMultiForms splits the gap between raw and fencelock at 1 and
// 16 goroutines on private keys into the parts of the backend's acquiring
// multi, in one interleaved run: the multi itself, the parent's SetData,
// the floor's check, then the backend alone on one session and the whole
// client.
func BenchmarkMultiForms(b *testing.B) {
	libs := []benchkit.Lib{raw, multiForm("multi-create", 1), multiForm("+parent-set", 2), multiForm("+floor-check", 3), backendShared, fencelockLib(true)}
	for _, r := range []struct{ goroutines, turn int }{{1, 100}, {16, 400}} {
		b.Run("goroutines="+strconv.Itoa(r.goroutines), func(b *testing.B) {
			benchkit.Interleaved(b, r.goroutines, r.turn, libs, benchkit.Rate("ops/s"))
		})
	}
}
