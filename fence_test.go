package fencelock_test

import (
	"errors"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/fencingdoc"
)

func TestFence(t *testing.T) {
	var f fencelock.Fence
	steps := []struct {
		token  fencelock.Token
		holder string
		ok     bool
	}{
		{5, "a", true},  // first write
		{5, "a", true},  // the live holder writes again
		{5, "b", false}, // same token, another grant: forged or confused
		{4, "z", false}, // older token: a paused holder's late write
		{7, "b", true},  // next holder
		{5, "a", false}, // the old holder wakes up
		{0, "", false},  // no token at all
		{8, "b", true},  // rotation for a live holder
	}
	for i, s := range steps {
		err := f.Check("acct/1", s.token, s.holder)
		if (err == nil) != s.ok {
			t.Fatalf("step %d: Check(%d, %q) = %v; want ok=%v", i, s.token, s.holder, err, s.ok)
		}
		var se *fencelock.StaleTokenError
		if err != nil && (!errors.Is(err, fencelock.ErrStaleToken) || !errors.As(err, &se) || se.Token != s.token) {
			t.Fatalf("step %d: error %v is not a *StaleTokenError", i, err)
		}
	}
	if h := f.Highest("acct/1"); h != 8 {
		t.Errorf("Highest = %d", h)
	}
	if err := f.Check("acct/2", 1, "c"); err != nil {
		t.Errorf("resources are independent: %v", err)
	}
}

// TestFenceFollowsDocumentedRule: Fence.Check decides every case of
// docs/fencing.md's table as the page says. The PostgreSQL and Redis
// patterns of that page run through the same table in their backends'
// tests, so Fence and every documented pattern apply one rule.
func TestFenceFollowsDocumentedRule(t *testing.T) {
	doc, err := fencingdoc.Load(fencingdoc.RepoFile("docs/fencing.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) < 10 {
		t.Fatalf("docs/fencing.md has %d cases", len(doc.Cases))
	}
	var f fencelock.Fence
	var high fencelock.Token
	for _, c := range doc.Cases {
		err := f.Check("resource", fencelock.Token(c.Token), c.Holder)
		if (err == nil) != c.Accept {
			t.Fatalf("step %d (%s): Check(%d, %q) = %v; the page says accepted=%v", c.Step, c.Why, c.Token, c.Holder, err, c.Accept)
		}
		if c.Accept {
			high = fencelock.Token(c.Token)
		} else if !errors.Is(err, fencelock.ErrStaleToken) {
			t.Fatalf("step %d: %v is not ErrStaleToken", c.Step, err)
		}
		if h := f.Highest("resource"); h != high {
			t.Fatalf("step %d: Highest = %d, want %d", c.Step, h, high)
		}
	}
}
