package etcdbench

import (
	"context"
	"strconv"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/internal/benchkit"
)

// rawForm is raw with parts of the backend's acquire transaction added:
// the entry under a queue prefix, the compare over the whole prefix, the
// token floor read (in Then, as the backend did until 2026-11-25) or
// compared by its mod revision (as it does now), and the Else branch's
// reads (sent, not run, on a free key): 2 as the backend sent them (the
// queue's head and the floor), or the 4 it sent before 2026-11-24 (also
// the owner's entry and the key's rotation marker). It finds which part
// of the backend's transaction costs what raw's does not.
func rawForm(name string, prefixCompare, floorRead, floorCompare bool, elseReads int) benchkit.Lib {
	return rawForms(name, prefixCompare, floorRead, floorCompare, elseReads, false, false)
}

// rawForms is rawForm with the backend's release grown too: the owner's
// two value compares (ownerCompare) and the nested transaction that
// deletes the key's lock-delay marker if it is the owner's (delayTxn).
func rawForms(name string, prefixCompare, floorRead, floorCompare bool, elseReads int, ownerCompare, delayTxn bool) benchkit.Lib {
	return benchkit.Lib{Name: name, Setup: func(b *testing.B) benchkit.Lockers {
		cli := client(b)
		lease, err := cli.Grant(context.Background(), int64(ttl.Seconds()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cli.Revoke(context.Background(), lease.ID) })
		kctx, cancel := context.WithCancel(context.Background())
		b.Cleanup(cancel)
		if _, err := cli.KeepAlive(kctx, lease.ID); err != nil {
			b.Fatal(err)
		}
		prefix := "/form-" + benchkit.RandomHex() + "/"
		floor := prefix + "floor"
		return func(i int) (try, wait benchkit.LockFunc) {
			n := 0
			try = func(ctx context.Context, key string) (func() error, error) {
				n++
				qp := prefix + "q/" + key + "/"
				me := qp + "bench%2F0123456789ab." + strconv.Itoa(i) + "-" + strconv.Itoa(n)
				cmp := clientv3.Compare(clientv3.CreateRevision(me), "=", 0)
				if prefixCompare {
					cmp = clientv3.Compare(clientv3.CreateRevision(qp), "=", 0).WithPrefix()
				}
				value := "bench/0123456789ab." + strconv.Itoa(n)
				if ownerCompare {
					value += "\x00" // the owner, a NUL and no metadata, as the backend writes
				}
				then := []clientv3.Op{clientv3.OpPut(me, value, clientv3.WithLease(lease.ID))}
				var els []clientv3.Op
				cmps := []clientv3.Cmp{cmp}
				if floorCompare {
					cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(floor), "=", 0))
				}
				if floorRead {
					then = append(then, clientv3.OpGet(floor))
				}
				switch elseReads {
				case 2:
					els = []clientv3.Op{clientv3.OpGet(qp, clientv3.WithFirstCreate()...), clientv3.OpGet(floor)}
				case 4:
					els = []clientv3.Op{clientv3.OpGet(qp, clientv3.WithFirstCreate()...), clientv3.OpGet(me), clientv3.OpGet(prefix + "m/" + key), clientv3.OpGet(floor)}
				}
				resp, err := cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
				if err != nil {
					return nil, err
				}
				if !resp.Succeeded {
					return nil, benchkit.ErrHeld
				}
				rev := resp.Header.Revision
				return func() error {
					cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(me), "=", rev)}
					if ownerCompare {
						owner := "bench/0123456789ab." + strconv.Itoa(n)
						cmps = append(cmps, clientv3.Compare(clientv3.Value(me), ">", owner), clientv3.Compare(clientv3.Value(me), "<", owner+"\x01"))
					}
					ops := []clientv3.Op{clientv3.OpDelete(me)}
					if delayTxn {
						dk := prefix + "d/" + key
						ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(dk), "=", "owner")}, []clientv3.Op{clientv3.OpDelete(dk)}, nil))
					}
					_, err := cli.Txn(context.Background()).If(cmps...).Then(ops...).Commit()
					return err
				}, nil
			}
			return try, nil
		}
	}}
}

// BenchmarkTxnForms: raw, raw's transaction grown step by step into the
// backend's, and the backend alone on one shared connection (as raw has),
// interleaved.
func BenchmarkTxnForms(b *testing.B) {
	shared := backendOnlyShared
	libs := []benchkit.Lib{raw, rawForm("entry", false, false, false, 0), rawForm("entry+prefix-compare", true, false, false, 0),
		rawForm("entry+prefix-compare+floor-compare", true, false, true, 0),
		rawForm("entry+prefix-compare+floor-read", true, true, false, 0),
		rawForm("entry+prefix-compare+floor-read+else-2-reads", true, true, false, 2),
		rawForm("entry+prefix-compare+floor-read+else-4-reads", true, true, false, 4),
		rawForms("backend-txns", true, false, true, 0, true, true), shared, backendOnly}
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) { benchkit.Interleaved(b, g, 50*g, libs) })
	}
}
