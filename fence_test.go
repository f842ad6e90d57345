package fencelock_test

import (
	"errors"
	"testing"

	"github.com/fencelock/fencelock"
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
