package contender

import (
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/recipe"
	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/history"
)

// TestContenderSemaphore: with Permits, a contender takes permits of the
// semaphore on its key: its Acquire calls name the semaphore's key, its
// grants, beliefs and writes the slot keys; three workers on two permits
// fill the semaphore, and the history passes the checker with S1 and S2.
func TestContenderSemaphore(t *testing.T) {
	const ttl = 300 * time.Millisecond
	r := startContender(t, Config{Proc: "c1", URL: "mem://contender-semaphore", Keys: []string{"s"}, TTL: ttl,
		Hold: 60 * time.Millisecond, Workers: 3, Permits: 2})
	r.await(12, "released", kind(history.Released))
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	h := append(r.events(), r.fence.Log()...)
	h.Sort()
	slots := map[string]bool{}
	for _, ev := range h {
		switch ev.Kind {
		case history.AcquireStart, history.AcquireFailed:
			if ev.Key != "s" {
				t.Fatalf("%s names %q, not the semaphore's key: %+v", ev.Kind, ev.Key, ev)
			}
		case history.Acquired, history.Belief, history.Write, history.ReleaseStart, history.Released:
			slot, ok := strings.CutPrefix(ev.Key, semPrefix)
			if !ok || (slot != "0" && slot != "1") {
				t.Fatalf("%s names %q, not a slot key of s: %+v", ev.Kind, ev.Key, ev)
			}
			slots[ev.Key] = true
		}
	}
	if len(slots) != 2 {
		t.Errorf("slots used: %v, want both", slots)
	}
	res := check.Check(h, check.Config{TTL: ttl, Permits: 2})
	if !res.OK() {
		t.Fatalf("failed %v on a healthy store: %+v", res.Failed(), res.Properties)
	}
	if res.Stats.MaxHolders != 2 {
		t.Errorf("at most %d holders at once, want 2 (three workers on two permits)", res.Stats.MaxHolders)
	}
	if _, ok := res.Property("S1"); !ok {
		t.Error("no S1 in the result")
	}
}

// TestContenderRWLock: with RW, a contender takes read and write grants
// of the read-write lock on its key: a writer's Acquire and grant name the
// gate, a reader's grant its slot; accesses go to the resource named by
// the lock's key, as reads and writes, and the history passes the checker
// with W1..W3.
func TestContenderRWLock(t *testing.T) {
	const ttl = 300 * time.Millisecond
	r := startContender(t, Config{Proc: "c1", URL: "mem://contender-rwlock", Keys: []string{"L"}, TTL: ttl,
		Hold: 60 * time.Millisecond, Workers: 3, RW: true})
	r.await(15, "released", kind(history.Released))
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	h := append(r.events(), r.fence.Log()...)
	h.Sort()
	gate := rwRecords[0]
	var reads, writes, writers, readers int
	for _, ev := range h {
		switch ev.Kind {
		case history.AcquireStart, history.AcquireFailed:
			if ev.Key != "L" && ev.Key != gate {
				t.Fatalf("%s names %q: %+v", ev.Kind, ev.Key, ev)
			}
		case history.Acquired:
			switch {
			case ev.Key == gate:
				writers++
			case strings.HasPrefix(ev.Key, rwPrefix+"r/"):
				readers++
			default:
				t.Fatalf("grant of %q: %+v", ev.Key, ev)
			}
		case history.Write:
			if ev.Key != "L" || !ev.Accepted {
				t.Fatalf("access %+v", ev)
			}
			switch ev.Access {
			case "read":
				reads++
			case "write":
				writes++
			default:
				t.Fatalf("access %+v", ev)
			}
		}
	}
	if writers == 0 || readers == 0 || reads == 0 || writes == 0 {
		t.Errorf("%d writers, %d readers, %d reads, %d writes: want some of each", writers, readers, reads, writes)
	}
	res := check.Check(h, check.Config{TTL: ttl, RW: true})
	if !res.OK() {
		t.Fatalf("failed %v on a healthy store: %+v", res.Failed(), res.Properties)
	}
	if p, _ := res.Property("W3"); p.Checked == 0 {
		t.Error("W3 judged no access")
	}
}

var (
	semPrefix, _        = recipe.Keys("s", 1) // the semaphore "s"'s slot keys' prefix
	rwPrefix, rwRecords = recipe.Keys("L", 0) // the read-write lock "L"'s records and what they start with
)
