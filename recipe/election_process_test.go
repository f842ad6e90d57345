//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package recipe_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/file"
	"github.com/fencelock/fencelock/recipe"
)

const (
	electHelperEnv = "FENCELOCK_ELECT_TEST_HELPER"
	electKey       = "demo/leader"
	electTTL       = 2 * time.Second
)

// electEvent is one line a campaigner process prints: its callback
// started ("leading") or its context ended ("stopped"), or its observer
// saw a leader ("observed"; Identity empty for no leader).
type electEvent struct {
	Proc     string `json:"proc"`
	Kind     string `json:"kind"`
	Identity string `json:"identity,omitempty"`
	Value    string `json:"value,omitempty"`
	Token    uint64 `json:"token,omitempty"`
	at       time.Time
}

// TestElectThreeProcesses is issue 21's demonstration: three campaigner
// processes on one file backend (a real store shared by processes on one
// machine), each also observing the election with Observe, and an observer
// in this process. The leader is killed with SIGKILL (nothing released, no
// goodbye); the test asserts that another process's callback starts and
// that every surviving observer sees the change within the backend's loss
// bound: the TTL the dead leader's record keeps the key for, plus slack.
func TestElectThreeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	events := make(chan electEvent, 256)
	procs := map[string]*exec.Cmd{}
	stdins := map[string]io.Closer{}
	var readers sync.WaitGroup
	for _, id := range []string{"p1", "p2", "p3"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestElectHelperProcess$")
		cmd.Env = append(os.Environ(), electHelperEnv+"=1", "ELECT_DIR="+dir, "ELECT_ID="+id)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[id], stdins[id] = cmd, stdin
		readers.Add(1)
		go func() {
			defer readers.Done()
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var ev electEvent
				if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Proc == "" {
					continue // the test framework's own output
				}
				ev.at = time.Now()
				events <- ev
			}
		}()
	}
	stopped := map[string]bool{}
	t.Cleanup(func() {
		// Closing a child's stdin ends its campaign: it resigns and exits.
		for id, in := range stdins {
			in.Close()
			if stopped[id] {
				continue
			}
			done := make(chan error, 1)
			go func() { done <- procs[id].Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("campaigner %s exited with %v", id, err)
				}
			case <-time.After(30 * time.Second):
				_ = procs[id].Process.Kill()
				t.Errorf("campaigner %s did not exit within 30s of its stdin closing", id)
			}
		}
		readers.Wait()
	})

	// This process observes too.
	b, err := file.New(t.Context(), &file.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, b, &fencelock.Options{TTL: electTTL})
	ch, err := recipe.Observe(t.Context(), c, electKey)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for l := range ch {
			events <- electEvent{Proc: "test", Kind: "observed", Identity: l.Identity, Value: string(l.Value), Token: uint64(l.Token), at: time.Now()}
		}
	}()

	// state: what each process last reported.
	leading := map[string]electEvent{}  // proc → its current term
	observed := map[string]electEvent{} // observer → the last leader it saw
	apply := func(ev electEvent) {
		switch ev.Kind {
		case "leading":
			leading[ev.Proc] = ev
		case "stopped":
			delete(leading, ev.Proc)
		case "observed":
			if prev, ok := observed[ev.Proc]; ok && ev.Token != 0 && ev.Token < prev.Token {
				t.Errorf("observer %s saw %s#%d after %s#%d: tokens went back", ev.Proc, ev.Identity, ev.Token, prev.Identity, prev.Token)
			}
			observed[ev.Proc] = ev
		}
		if len(leading) > 1 {
			t.Errorf("two processes report leading at once: %v", leading)
		}
	}
	await := func(what string, d time.Duration, done func() bool) {
		t.Helper()
		deadline := time.After(d)
		for !done() {
			select {
			case ev := <-events:
				apply(ev)
			case <-deadline:
				t.Fatalf("%s: not within %v; leading %v, observed %v", what, d, leading, observed)
			}
		}
	}
	observers := []string{"p1", "p2", "p3", "test"}
	allSee := func(identity string, token uint64, among []string) func() bool {
		return func() bool {
			for _, o := range among {
				if ev := observed[o]; ev.Identity != identity || ev.Token != token {
					return false
				}
			}
			return true
		}
	}

	var first electEvent
	await("a first leader", 30*time.Second, func() bool {
		for _, ev := range leading {
			first = ev
			return true
		}
		return false
	})
	await("every observer seeing the first leader", 10*time.Second, allSee(first.Proc, first.Token, observers))
	if observed["test"].Value != "addr-"+first.Proc {
		t.Errorf("observed value %q; want addr-%s", observed["test"].Value, first.Proc)
	}

	killed := time.Now()
	if err := procs[first.Proc].Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = procs[first.Proc].Wait()
	stopped[first.Proc] = true
	delete(leading, first.Proc) // it cannot say so itself
	bound := electTTL + time.Second
	var next electEvent
	await("a new leader's callback", bound, func() bool {
		for _, ev := range leading {
			next = ev
			return true
		}
		return false
	})
	if next.Token <= first.Token {
		t.Errorf("new leader %s has token %d, not above the killed leader's %d", next.Proc, next.Token, first.Token)
	}
	var survivors []string
	for _, o := range observers {
		if o != first.Proc {
			survivors = append(survivors, o)
		}
	}
	await("every surviving observer seeing the new leader", bound-time.Since(killed)+100*time.Millisecond, allSee(next.Proc, next.Token, survivors))
	t.Logf("killed %s (token %d); %s's callback started %v later (token %d)", first.Proc, first.Token, next.Proc, next.at.Sub(killed), next.Token)
	for _, o := range survivors {
		ev := observed[o]
		t.Logf("observer %s saw %s#%d %v after the kill", o, ev.Identity, ev.Token, ev.at.Sub(killed))
		if d := ev.at.Sub(killed); d > bound {
			t.Errorf("observer %s saw the change %v after the kill; want within the loss bound %v (TTL %v + slack)", o, d, bound, electTTL)
		}
	}
	// The dead leader renewed at most one RenewInterval (TTL/3) before
	// the kill, and its record lives TTL from then.
	if d, early := next.at.Sub(killed), electTTL-electTTL/3-50*time.Millisecond; d < early {
		t.Errorf("the new leader started %v after the kill: before the dead leader's record could have expired (TTL %v, renewed every %v)", d, electTTL, electTTL/3)
	}
	if l, err := recipe.CurrentLeader(t.Context(), c, electKey); err != nil || l.Identity != next.Proc || l.Token != fencelock.Token(next.Token) {
		t.Errorf("Leader = %+v, %v; want %s#%d", l, err, next.Proc, next.Token)
	}
}

// TestElectHelperProcess is the body of TestElectThreeProcesses's
// campaigner processes; run directly, it does nothing. It campaigns and
// observes until its stdin is closed, printing one JSON line per event.
func TestElectHelperProcess(t *testing.T) {
	if os.Getenv(electHelperEnv) != "1" {
		t.Skip("helper process for TestElectThreeProcesses")
	}
	id, dir := os.Getenv("ELECT_ID"), os.Getenv("ELECT_DIR")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	emit := func(ev electEvent) {
		ev.Proc = id
		mu.Lock()
		defer mu.Unlock()
		_ = out.Encode(ev)
	}
	open := func() *fencelock.Client {
		b, err := file.New(ctx, &file.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		c, err := fencelock.New(b, &fencelock.Options{TTL: electTTL})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Separate clients for the campaign and the observer, as
	// recipe.Observe's documentation advises.
	campaigner, observer := open(), open()
	defer observer.Close()
	defer campaigner.Close()
	ch, err := recipe.Observe(ctx, observer, electKey)
	if err != nil {
		t.Fatal(err)
	}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for l := range ch {
			emit(electEvent{Kind: "observed", Identity: l.Identity, Value: string(l.Value), Token: uint64(l.Token)})
		}
	}()
	err = recipe.Elect(ctx, campaigner, electKey, id, []byte("addr-"+id), func(ctx context.Context, l *fencelock.Lease) error {
		emit(electEvent{Kind: "leading", Identity: id, Token: uint64(l.Token())})
		<-ctx.Done()
		emit(electEvent{Kind: "stopped", Identity: id, Token: uint64(l.Token())})
		return nil
	}, nil)
	if ctx.Err() == nil {
		t.Errorf("Elect returned %v before the campaign was stopped", err)
	}
	cancel()
	<-watched
	fmt.Fprintln(os.Stderr, "campaigner", id, "done")
}
