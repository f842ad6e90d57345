package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/internal/fencingdoc"
	"github.com/fencelock/fencelock/safety/history"
)

// TestMain checks that no test leaves a goroutine behind: Server.Close
// and Client.Close must end everything they started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T, fencing bool) (*Server, *Client) {
	t.Helper()
	s, err := Listen(t.TempDir(), fencing)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c, err := Dial(context.Background(), s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return s, c
}

type attempt struct {
	key, lease string
	token      uint64
	accepted   bool
	reason     string
}

func run(t *testing.T, c *Client, steps []attempt) {
	t.Helper()
	for i, a := range steps {
		d, err := c.Write(context.Background(), a.key, a.lease, "p-"+a.lease, a.token)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Accepted != a.accepted || d.Reason != a.reason {
			t.Errorf("step %d: write(%s, %s, token %d) = accepted %v (%s), want %v (%s)",
				i, a.key, a.lease, a.token, d.Accepted, d.Reason, a.accepted, a.reason)
		}
	}
}

// TestRule checks the accept rule with fencing on: accept iff token > max,
// or token == max from the lease that first wrote it.
func TestRule(t *testing.T) {
	s, c := start(t, true)
	steps := []attempt{
		{"k", "A", 5, true, ReasonNewer},
		{"k", "A", 5, true, ReasonSameLease},        // same lease, same token: repeated writes
		{"k", "B", 5, false, ReasonEqualOtherLease}, // a token issued twice
		{"k", "B", 4, false, ReasonStale},
		{"k", "B", 0, false, ReasonZeroToken},
		{"other", "B", 1, true, ReasonNewer}, // keys are independent
		{"k", "B", 6, true, ReasonNewer},
		{"k", "A", 5, false, ReasonStale}, // the old holder, after the new one wrote
		{"k", "A", 6, false, ReasonEqualOtherLease},
		{"k", "B", 6, true, ReasonSameLease},
	}
	run(t, c, steps)
	log := s.Log()
	if len(log) != len(steps) {
		t.Fatalf("log has %d events, want %d", len(log), len(steps))
	}
	for i, ev := range log {
		a := steps[i]
		want := history.Event{T: ev.T, Proc: "p-" + a.lease, Kind: history.Write, Key: a.key, Lease: a.lease,
			Token: a.token, Accepted: a.accepted, Reason: a.reason, Fencing: true}
		if ev != want {
			t.Errorf("log[%d] = %+v, want %+v", i, ev, want)
		}
		if i > 0 && ev.T < log[i-1].T {
			t.Errorf("log[%d].T = %d before log[%d].T = %d", i, ev.T, i-1, log[i-1].T)
		}
	}
}

// TestFencingOff checks the negative-control mode: every write is accepted
// and logged with Fencing false and the reason fencing would have given;
// a stale write accepted with fencing off does not lower the highest token.
func TestFencingOff(t *testing.T) {
	s, c := start(t, false)
	run(t, c, []attempt{
		{"k", "A", 5, true, ReasonNewer},
		{"k", "B", 6, true, ReasonNewer},
		{"k", "A", 5, true, ReasonStale},
		{"k", "C", 6, true, ReasonEqualOtherLease},
	})
	s.SetFencing(true)
	run(t, c, []attempt{
		{"k", "B", 6, true, ReasonSameLease},
		{"k", "A", 5, false, ReasonStale},
		{"k", "C", 6, false, ReasonEqualOtherLease},
	})
	log := s.Log()
	for i, ev := range log {
		if wantFencing := i >= 4; ev.Fencing != wantFencing {
			t.Errorf("log[%d].Fencing = %v, want %v", i, ev.Fencing, wantFencing)
		}
	}
	if !log[2].Accepted || log[2].Reason != ReasonStale {
		t.Errorf("stale write with fencing off logged as %+v, want accepted with reason %q", log[2], ReasonStale)
	}
}

// TestConcurrent checks, under -race, that writes from many connections
// and from many goroutines sharing one Client are each decided once, all
// logged, in T order, and that every accepted write obeys the rule against
// the writes accepted before it.
func TestConcurrent(t *testing.T) {
	s, shared := start(t, true)
	const conns, perConn, keys = 4, 200, 3
	var wg sync.WaitGroup
	type result struct {
		lease string
		key   string
		token uint64
		d     Decision
	}
	results := make(chan result, 2*conns*perConn)
	writer := func(c *Client, name string) {
		defer wg.Done()
		for i := 0; i < perConn; i++ {
			key := fmt.Sprintf("k%d", i%keys)
			lease := fmt.Sprintf("%s-%d", name, i/10) // each lease writes a few times
			token := uint64(i/10 + 1)
			d, err := c.Write(context.Background(), key, lease, name, token)
			if err != nil {
				t.Error(err)
				return
			}
			results <- result{lease, key, token, d}
		}
	}
	for i := 0; i < conns; i++ {
		c, err := Dial(context.Background(), s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Add(2)
		go writer(c, fmt.Sprintf("own%d", i))
		go writer(shared, fmt.Sprintf("shared%d", i))
	}
	wg.Wait()
	close(results)

	log := s.Log()
	if len(log) != 2*conns*perConn {
		t.Fatalf("log has %d events, want %d", len(log), 2*conns*perConn)
	}
	logged := make(map[string]int, len(log)) // decision key → count
	dkey := func(t int64, lease, key string, token uint64, accepted bool, reason string) string {
		return fmt.Sprintf("%d %s/%s %d %v %s", t, lease, key, token, accepted, reason)
	}
	type state struct {
		token uint64
		lease string
	}
	max := map[string]state{}
	for i, ev := range log {
		if i > 0 && ev.T < log[i-1].T {
			t.Fatalf("log[%d].T = %d before log[%d].T = %d", i, ev.T, i-1, log[i-1].T)
		}
		logged[dkey(ev.T, ev.Lease, ev.Key, ev.Token, ev.Accepted, ev.Reason)]++
		st := max[ev.Key]
		want := ev.Token > st.token || (ev.Token == st.token && ev.Lease == st.lease)
		if ev.Accepted != want {
			t.Errorf("log[%d] %+v: accepted %v, but the rule against max %+v says %v", i, ev, ev.Accepted, st, want)
		}
		if ev.Accepted && ev.Token > st.token {
			max[ev.Key] = state{ev.Token, ev.Lease}
		}
	}
	n := 0
	for r := range results {
		n++
		k := dkey(r.d.T, r.lease, r.key, r.token, r.d.Accepted, r.d.Reason)
		if logged[k] == 0 {
			t.Errorf("decision %+v for %s/%s token %d has no matching log event", r.d, r.lease, r.key, r.token)
		}
		logged[k]--
	}
	if n != len(log) {
		t.Errorf("%d decisions returned, %d logged", n, len(log))
	}
}

// TestLogAppendOnly checks that Log returns copies and that a later log
// starts with the earlier one.
func TestLogAppendOnly(t *testing.T) {
	s, c := start(t, true)
	run(t, c, []attempt{{"k", "A", 1, true, ReasonNewer}, {"k", "A", 1, true, ReasonSameLease}})
	first := s.Log()
	keep := append(history.History(nil), first...)
	first[0].Accepted = false // must not reach the server's log
	run(t, c, []attempt{{"k", "B", 1, false, ReasonEqualOtherLease}})
	second := s.Log()
	if len(second) != 3 {
		t.Fatalf("log has %d events, want 3", len(second))
	}
	for i := range keep {
		if second[i] != keep[i] {
			t.Errorf("log[%d] changed from %+v to %+v", i, keep[i], second[i])
		}
	}
}

// TestWriteContext checks that a Write whose ctx ends while it waits for
// an answer returns ctx's error at once and leaves the client broken.
func TestWriteContext(t *testing.T) {
	// A server that reads requests and never answers.
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "silent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	c, err := Dial(context.Background(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc := <-accepted
	if sc == nil {
		t.Fatal("silent server did not accept")
	}
	defer sc.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Write(ctx, "k", "A", "p", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Write to a silent server = %v, want %v", err, context.DeadlineExceeded)
	}
	if _, err := c.Write(context.Background(), "k", "A", "p", 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after an interrupted one = %v, want ErrClosed", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	c2, err := Dial(context.Background(), ln.Addr().String())
	if err == nil {
		defer c2.Close()
		if _, err := c2.Write(ctx, "k", "A", "p", 1); !errors.Is(err, context.Canceled) {
			t.Fatalf("Write with a cancelled ctx = %v, want %v", err, context.Canceled)
		}
	}
}

// TestClose checks that closing the server ends its connections (a Write
// fails rather than hangs), keeps the log readable, and that Client.Close
// makes later writes return ErrClosed.
func TestClose(t *testing.T) {
	s, c := start(t, true)
	run(t, c, []attempt{{"k", "A", 1, true, ReasonNewer}})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := c.Write(context.Background(), "k", "A", "p", 1); err == nil {
		t.Fatal("Write to a closed server succeeded")
	}
	if n := len(s.Log()); n != 1 {
		t.Fatalf("log after Close has %d events, want 1", n)
	}
	if _, err := Dial(context.Background(), s.Addr()); err == nil {
		t.Fatal("Dial to a closed server succeeded")
	}

	s2, c2 := start(t, true)
	_ = s2
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Write(context.Background(), "k", "A", "p", 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close = %v, want ErrClosed", err)
	}
}

// TestMalformed checks that a request the server cannot read is answered
// with an error, logged nowhere, and ends the connection.
func TestMalformed(t *testing.T) {
	s, _ := start(t, true)
	for _, line := range []string{"not json\n", `{"key":"","lease":"A","token":1}` + "\n", `{"key":"k","token":1}` + "\n"} {
		conn, err := net.Dial("unix", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		var rep reply
		if err := json.NewDecoder(conn).Decode(&rep); err != nil {
			t.Fatalf("%q: reading the answer: %v", line, err)
		}
		if rep.Err == "" {
			t.Errorf("%q: answered %+v, want an error", line, rep)
		}
		conn.Close()
	}
	if n := len(s.Log()); n != 0 {
		t.Errorf("malformed requests logged %d events", n)
	}
}

func TestLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 110))
	if _, err := Listen(dir, true); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("Listen in a too long dir = %v, want an error naming the limit", err)
	}
}

// TestRuleFollowsDocumentedCases: the harness's resource decides every case
// of docs/fencing.md's table as the page says, the table Fence and the
// PostgreSQL and Redis patterns are tested with.
func TestRuleFollowsDocumentedCases(t *testing.T) {
	doc, err := fencingdoc.Load(fencingdoc.RepoFile("docs/fencing.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) < 10 {
		t.Fatalf("docs/fencing.md has %d cases", len(doc.Cases))
	}
	_, c := start(t, true)
	for _, dc := range doc.Cases {
		d, err := c.Write(context.Background(), "k", dc.Holder, "p-"+dc.Holder, dc.Token)
		if err != nil {
			t.Fatalf("step %d: %v", dc.Step, err)
		}
		if d.Accepted != dc.Accept {
			t.Fatalf("step %d (%s): token %d from %q: accepted %v (%s); the page says %v", dc.Step, dc.Why, dc.Token, dc.Holder, d.Accepted, d.Reason, dc.Accept)
		}
	}
}
