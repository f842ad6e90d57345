package redis_test

import (
	"strconv"
	"testing"

	"github.com/fencelock/fencelock/internal/fencingdoc"
)

// TestDocumentedLuaFencePatternFollowsRule is the regression test for the
// documented Redis fencing pattern that disagreed with Fence (it accepted
// an equal token from any holder, and compared tokens with tonumber, so
// tokens past 2^53 collided): it runs docs/fencing.md's own Lua script, as
// the page prints it, against a real Redis through the page's table of
// cases (the table Fence is tested with) and checks each outcome and what
// the data and fence keys hold after it.
func TestDocumentedLuaFencePatternFollowsRule(t *testing.T) {
	doc, err := fencingdoc.Load(fencingdoc.RepoFile("docs/fencing.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) < 10 {
		t.Fatalf("docs/fencing.md has %d cases", len(doc.Cases))
	}
	src, err := doc.Block("redis-write")
	if err != nil {
		t.Fatal(err)
	}
	_, rdb := open(t)
	ctx := t.Context()
	tag := "{" + uniquePrefix(t) + "}"
	data, fence := tag+":data", tag+":fence"
	t.Cleanup(func() { rdb.Del(ctx, data, fence) })
	var value, high, holder string // what an accepted write leaves
	for _, c := range doc.Cases {
		tok := strconv.FormatUint(c.Token, 10)
		v := "write-" + strconv.Itoa(c.Step)
		n, err := rdb.Eval(ctx, src, []string{data, fence}, tok, c.Holder, v).Int64()
		if err != nil {
			t.Fatalf("step %d: %v", c.Step, err)
		}
		if (n == 1) != c.Accept || (n != 0 && n != 1) {
			t.Fatalf("step %d (%s): token %s from %q: script returned %d; the page says accepted=%v", c.Step, c.Why, tok, c.Holder, n, c.Accept)
		}
		if c.Accept {
			value, high, holder = v, tok, c.Holder
		}
		got, _ := rdb.Get(ctx, data).Result()
		f, err := rdb.HGetAll(ctx, fence).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got != value || f["token"] != high || f["owner"] != holder {
			t.Fatalf("step %d (%s): data %q, fence %v; want data %q, fence token %q owner %q", c.Step, c.Why, got, f, value, high, holder)
		}
	}
}
