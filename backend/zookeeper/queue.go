package zookeeper

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

const (
	nodePrefix = "_c_" // protected-mode style: _c_<nonce>-lock-<seq>
	seqMarker  = "-lock-"
)

func newNonce() string {
	var n [12]byte
	_, _ = crand.Read(n[:])
	return hex.EncodeToString(n[:])
}

type child struct {
	name string
	seq  int32
}

// sortChildren returns the contender znodes among names, in queue order.
// Sequence numbers are compared with wrap-around arithmetic, so the queue
// stays ordered when a parent's counter passes 2^31.
func sortChildren(names []string) []child {
	cs := make([]child, 0, len(names))
	for _, n := range names {
		if !strings.HasPrefix(n, nodePrefix) {
			continue
		}
		i := strings.LastIndex(n, seqMarker)
		if i < 0 {
			continue
		}
		s, err := strconv.ParseInt(n[i+len(seqMarker):], 10, 64)
		if err != nil {
			continue
		}
		cs = append(cs, child{n, int32(s)})
	}
	slices.SortFunc(cs, func(a, b child) int {
		d := a.seq - b.seq
		switch {
		case d < 0:
			return -1
		case d > 0:
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	return cs
}

// entry is a contender znode just created by enqueue.
type entry struct {
	node     string
	czxid    int64 // the znode's czxid: the zxid of the creating transaction
	n        int32 // the parent's number of children right after
	aversion int32 // the parent's ACL version then (see markedSet)
}

// enqueue creates this contender's EPHEMERAL|SEQUENTIAL znode under the
// key's parent in one transaction with a version check of the token floor
// znode (see floor.go) and a no-op write to the parent, whose
// returned Stat says how many contenders there are (numChildren 1: we hold
// the lock) and carries the transaction's zxid, which is our znode's czxid.
// It creates the parent (a container znode) when missing.
func (b *Backend) enqueue(ctx context.Context, parent string, data []byte) (entry, error) {
	nonce := newNonce()
	prefix := parent + "/" + nodePrefix + nonce + seqMarker
	for attempt := 0; ; attempt++ {
		fs, err := b.floorState(ctx)
		if err != nil {
			return entry{}, err
		}
		res, err := b.conn.Multi(ctx, b.lateCreate(parent, nonce),
			&zk.CreateRequest{Path: prefix, Data: data, Acl: b.acl, Flags: zk.FlagEphemeralSequential},
			&zk.SetDataRequest{Path: parent, Data: nil, Version: -1},
			b.floorCheck(fs), // the token offset in force at this zxid (floor.go)
		)
		switch {
		case err == nil && len(res) == 3 && res[1].Stat != nil:
			st := res[1].Stat
			b.fl.observe(fs, st.Mzxid)
			return entry{node: res[0].String, czxid: st.Mzxid, n: st.NumChildren, aversion: st.Aversion}, nil
		case err == nil:
			return entry{}, errors.New("zookeeper: malformed multi response")
		case floorMoved(res):
			// Raised since fs was read: read it again (no attempt is
			// used up; nothing was written).
			if err := ctx.Err(); err != nil {
				return entry{}, err
			}
			if _, err := b.readFloor(ctx, 0); err != nil {
				return entry{}, err
			}
			attempt--
			continue
		case errors.Is(err, zk.ErrNoNode) && attempt < 3:
			if err := ctx.Err(); err != nil {
				return entry{}, err
			}
			if err := b.ensureParent(ctx, parent); err != nil {
				return entry{}, err
			}
			continue
		case definiteZK(err):
			return entry{}, err
		default:
			// The reply was lost, or ctx ended before it came: the znode
			// may exist. Find it by its nonce and delete it, now or (if
			// the server is unreachable) later, so it never blocks the
			// queue.
			b.addOrphan(b.nonceOrphan(parent, nonce), err)
			return entry{}, err
		}
	}
}

// nonceOrphan is the clean-up of a create under parent with an unknown
// outcome: a search for its nonce, for a session timeout (at least 10 s)
// from now.
func (b *Backend) nonceOrphan(parent, nonce string) orphan {
	return orphan{parent: parent, nonce: nonce, until: time.Now().Add(max(b.SessionTimeout(), 10*time.Second))}
}

// lateCreate accounts for the answer to an enqueue multi that its caller
// abandoned when its context ended (the caller has recorded the nonce's
// clean-up, see enqueue): a znode that was created is deleted at once,
// whenever the answer comes, so a create that lands after the nonce
// search (a request that waited in go-zookeeper's queue while it
// reconnected, or on a server that stopped answering for longer) leaves
// no contender for nobody; an answer that is no answer (the connection was
// lost) starts the nonce search again, from now.
func (b *Backend) lateCreate(parent, nonce string) func([]zk.MultiResponse, error) {
	return func(res []zk.MultiResponse, err error) {
		switch {
		case err == nil && len(res) == 3:
			b.addOrphan(orphan{path: res[0].String}, nil)
			b.sweepSoon()
		case err == nil, definiteZK(err), floorMoved(res):
			// Nothing was created.
		default:
			b.addOrphan(b.nonceOrphan(parent, nonce), err)
		}
	}
}

// definiteZK reports whether err is an answer of the server (the request
// was executed or rejected as a whole), as opposed to a transport failure
// with an unknown outcome.
func definiteZK(err error) bool {
	for _, e := range []error{zk.ErrNoNode, zk.ErrNodeExists, zk.ErrBadVersion, zk.ErrNoAuth, zk.ErrInvalidACL,
		zk.ErrNoChildrenForEphemerals, zk.ErrNotEmpty, zk.ErrBadArguments, zk.ErrInvalidPath, zk.ErrNoServer} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (b *Backend) ensureParent(ctx context.Context, parent string) error {
	_, err := b.conn.CreateContainer(ctx, parent, nil, zk.FlagContainer, b.acl)
	if err == nil || errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	if !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	if err := b.ensurePath(ctx, b.root); err != nil {
		return err
	}
	_, err = b.conn.CreateContainer(ctx, parent, nil, zk.FlagContainer, b.acl)
	if errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	return err
}

// deleteOwn removes one of our contender znodes. It waits for the answer
// while ctx lives; once ctx has ended (a waiter whose caller gave up, a
// request abandoned at its deadline) it still sends the delete but waits
// at most answerGrace for the answer. If the server does not answer (in
// time), a later call retries (see sweep); the delete already sent may
// well go through meanwhile, and the retry then finds nothing to delete.
func (b *Backend) deleteOwn(ctx context.Context, node string) {
	b.clearRotating(node)
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), answerGrace)
		defer cancel()
	}
	err := b.conn.Delete(ctx, node, -1)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		b.addOrphan(orphan{path: node}, err)
	}
}

// answerGrace is how long a write whose caller's context ended still waits
// for its answer (see call), and deleteOwn for the answer to a delete made
// after it ended: a server that answers at all answers well within it, and
// the engine's overrun budget after a deadline (Options.ReleaseTimeout,
// shared with its own clean-up) is not spent waiting on one that does not.
const answerGrace = 100 * time.Millisecond
