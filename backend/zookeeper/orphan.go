package zookeeper

import (
	"errors"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

func (b *Backend) addOrphan(o orphan) {
	k := o.path
	if k == "" {
		k = "nonce:" + o.nonce
	}
	b.mu.Lock()
	b.orphans[k] = o
	b.mu.Unlock()
	b.wakeJanitor()
}

func (b *Backend) wakeJanitor() {
	select {
	case b.janitorCh <- struct{}{}:
	default:
	}
}

// janitor deletes orphaned contender znodes. It is the backend's one
// long-lived goroutine and ends on Close.
func (b *Backend) janitor() {
	defer b.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-b.done:
			t.Stop()
			return
		case <-b.janitorCh:
		case <-t.C:
		}
		if b.sweep() {
			t.Reset(backoff)
			backoff = min(2*backoff, 2*time.Second)
		} else {
			backoff = 50 * time.Millisecond
		}
	}
}

// sweep tries every pending clean-up once; it reports whether some remain.
func (b *Backend) sweep() bool {
	b.mu.Lock()
	todo := make(map[string]orphan, len(b.orphans))
	for k, o := range b.orphans {
		todo[k] = o
	}
	b.mu.Unlock()
	left := false
	for k, o := range todo {
		if b.closed.Load() {
			return false
		}
		var err error
		if o.path != "" {
			err = b.conn.Delete(o.path, -1)
			if errors.Is(err, zk.ErrNoNode) {
				err = nil
			}
		} else {
			var names []string
			names, _, err = b.conn.Children(o.parent)
			if errors.Is(err, zk.ErrNoNode) {
				err = nil
			}
			for _, n := range names {
				if strings.HasPrefix(n, nodePrefix+o.nonce+seqMarker) {
					if e := b.conn.Delete(o.parent+"/"+n, -1); e != nil && !errors.Is(e, zk.ErrNoNode) {
						err = e
					}
				}
			}
		}
		if err != nil {
			left = true
			b.log.Warn("zookeeper: could not delete an orphaned contender znode yet; retrying", "znode", o.path, "parent", o.parent, "err", err)
			continue
		}
		if o.nonce != "" && time.Now().Before(o.until) {
			left = true // look again later
			continue
		}
		b.mu.Lock()
		delete(b.orphans, k)
		b.mu.Unlock()
	}
	return left
}
