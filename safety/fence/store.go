package fence

import (
	"context"
	"fmt"
	"time"
)

// A Store is a real resource behind the server: a database or key-value
// store that applies each lock write through one of fencelock's kits
// (kit/postgres, kit/redis, kit/etcd), so that the store, not the
// server's own rule, decides which writes land. With a Store set and
// fencing on, the server sends every lock write to it, one at a time in
// the order of receipt, and logs the store's answer as its decision;
// the server still judges each write by its own rule, and records every
// write on which the two disagree (see Server.StoreFaults).
type Store interface {
	// Write applies one write of lease with token to key's resource. It
	// returns accepted false, with a nil error, when the store refused
	// the token as stale, and an error when the store could not be asked.
	Write(ctx context.Context, key, lease string, token uint64) (accepted bool, err error)
}

// storeTimeout bounds one Store.Write.
const storeTimeout = 10 * time.Second

// SetStore puts st behind the server for lock writes received from now on
// (a read-write lock's accesses are still judged by the server alone).
func (s *Server) SetStore(st Store) {
	s.mu.Lock()
	s.store = st
	s.mu.Unlock()
}

// StoreFaults returns what went wrong with the Store so far: each write
// on which the store's answer differed from the server's rule (a store
// that accepted a stale write, or refused a current one), and each write
// the store could not be asked about (logged as refused). An empty slice
// means the store agreed with the rule on every write.
func (s *Server) StoreFaults() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.storeFaults...)
}

// askStore sends one write to the store; s.mu is held, so writes reach
// the store one at a time, in the order of the log.
func (s *Server) askStore(req request, ruleAccepts bool, reason string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	accepted, err := s.store.Write(ctx, req.Key, req.Lease, req.Token)
	switch {
	case err != nil:
		s.storeFaults = append(s.storeFaults, fmt.Sprintf("write of lease %s (token %d) to %s: the store failed: %v", req.Lease, req.Token, req.Key, err))
		return false
	case accepted != ruleAccepts:
		s.storeFaults = append(s.storeFaults, fmt.Sprintf("write of lease %s (token %d) to %s: the store %s it; the rule says %s", req.Lease, req.Token, req.Key, verb(accepted), reason))
	}
	return accepted
}

func verb(accepted bool) string {
	if accepted {
		return "accepted"
	}
	return "refused"
}
