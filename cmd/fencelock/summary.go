package main

import (
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
)

// runSummary is the Observer behind `run --summary`: it counts the
// engine's events for one run and prints them as one line on exit, the
// same events (and names) the Prometheus and OpenTelemetry adapters export.
type runSummary struct {
	key string

	mu       sync.Mutex
	counts   map[fencelock.EventKind]int
	token    fencelock.Token
	wait     time.Duration
	held     time.Duration
	end      string
	endCause error
	heldKey  string // the key of the lease acquired (a permit's slot key), once acquired
	acquired time.Time
	lease    *fencelock.Lease // the lease run holds, once acquired (see setLease)
}

// setLease tells the summary which lease the run holds, so that a lease
// found lost at exit is reported as lost even if its event has not been
// observed yet (a session store can report the loss as the run exits).
func (s *runSummary) setLease(l *fencelock.Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lease = l
}

func newRunSummary(key string) *runSummary {
	return &runSummary{key: key, counts: make(map[fencelock.EventKind]int)}
}

// Observe implements fencelock.Observer.
func (s *runSummary) Observe(e fencelock.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.heldKey != "" && e.Key != s.heldKey {
		return // with --permits: the cancelled waits on the other slots
	}
	if e.Kind == fencelock.EventAcquired {
		s.heldKey, s.acquired = e.Key, time.Now()
	}
	s.counts[e.Kind]++
	if e.Token != 0 {
		s.token = e.Token
	}
	switch e.Kind {
	case fencelock.EventAcquired, fencelock.EventAcquireFailed, fencelock.EventNotAcquired:
		s.wait = e.Wait
		if e.Kind != fencelock.EventAcquired {
			s.end, s.endCause = e.Kind.String(), e.Err
		}
	case fencelock.EventReleased, fencelock.EventReleaseFailed, fencelock.EventLost:
		s.held = e.Held
		s.end, s.endCause = e.Kind.String(), e.Err
	}
}

// print writes the summary line.
func (s *runSummary) print(w io.Writer, u urlScrubber) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.end == "" && s.lease != nil && s.lease.Err() != nil {
		s.end, s.endCause = fencelock.EventLost.String(), s.lease.Err()
		s.held = time.Since(s.acquired)
	}
	end := s.end
	if end == "" {
		end = "none"
	}
	line := fmt.Sprintf("fencelock run: summary key=%s token=%d wait=%v held=%v renewed=%d renew_failed=%d danger_zone=%d token_rotated=%d end=%s",
		strconv.Quote(s.key), s.token, s.wait.Round(time.Millisecond), s.held.Round(time.Millisecond),
		s.counts[fencelock.EventRenewed], s.counts[fencelock.EventRenewFailed], s.counts[fencelock.EventDanger],
		s.counts[fencelock.EventRotated], end)
	if s.endCause != nil {
		line += " cause=" + strconv.Quote(u(s.endCause.Error()))
	}
	fmt.Fprintln(w, line)
}

// urlScrubber removes credentials from text.
type urlScrubber func(string) string
