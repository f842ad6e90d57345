package redisfence_test

import (
	"context"
	"testing"
	"time"

	redisfence "github.com/fencelock/fencelock/kit/redis"
)

// TestExample runs Example, with its keys deleted before and after, and
// checks what it wrote: the credit, its history and its fence.
func TestExample(t *testing.T) {
	ctx := ctxT(t)
	rdb := client(t, 0)
	fenceKey, err := redisfence.FenceKey("acct:1")
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"{acct:1}:balance", "{acct:1}:history", fenceKey}
	del := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			t.Logf("cleanup: %v", err)
		}
	}
	del()
	t.Cleanup(del)
	Example()
	if v, err := rdb.Get(ctx, "{acct:1}:balance").Result(); err != nil || v != "100" {
		t.Errorf("balance = %q, %v; want 100", v, err)
	}
	if n, err := rdb.LLen(ctx, "{acct:1}:history").Result(); err != nil || n != 1 {
		t.Errorf("history has %d entries, %v; want 1", n, err)
	}
	if m, err := rdb.HGetAll(ctx, fenceKey).Result(); err != nil || m["token"] == "" || m["owner"] == "" {
		t.Errorf("fence = %v, %v; want a token and owner", m, err)
	}
}
