package redisfence_test

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance/resource"
	"github.com/fencelock/fencelock/internal/testenv"
	redisfence "github.com/fencelock/fencelock/kit/redis"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// client returns a client of the test server speaking protocol (2 or 3;
// 0 for go-redis's default), closed when the test ends.
func client(t *testing.T, protocol int) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.URL(t, "FENCELOCK_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	if protocol != 0 {
		opt.Protocol = protocol
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// cleanup deletes keys when the test ends; safe for concurrent use.
type cleanup struct {
	mu   sync.Mutex
	keys map[string]bool
}

func newCleanup(t *testing.T, rdb *redis.Client) *cleanup {
	c := &cleanup{keys: map[string]bool{}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.mu.Lock()
		defer c.mu.Unlock()
		for k := range c.keys {
			if err := rdb.Del(ctx, k).Err(); err != nil {
				t.Logf("cleanup: %v", err)
				return
			}
		}
	})
	return c
}

func (c *cleanup) add(keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		c.keys[k] = true
	}
}

// key returns resource's key with suffix, carrying its hash tag, and the
// fence key, both deleted when the test ends.
func (c *cleanup) key(t *testing.T, resource, suffix string) string {
	tag, err := redisfence.Tag(resource)
	if err != nil {
		t.Error(err)
	}
	fence, _ := redisfence.FenceKey(resource)
	k := "{" + tag + "}" + suffix
	c.add(k, fence)
	return k
}

// kitResource is the conformance suite's resource: Do with a SET of the
// name's value key; Read is a GET.
type kitResource struct {
	t   *testing.T
	rdb *redis.Client
	c   *cleanup
}

func (r kitResource) Write(ctx context.Context, name string, token fencelock.Token, holder, value string) error {
	_, err := redisfence.Do(ctx, r.rdb, name, token, holder,
		redisfence.Cmd{Name: "SET", Keys: []string{r.c.key(r.t, name, ":value")}, Args: []any{value}})
	return err
}

func (r kitResource) Read(ctx context.Context, name string) (string, bool, error) {
	v, err := r.rdb.Get(ctx, r.c.key(r.t, name, ":value")).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	return v, err == nil, err
}

func TestResourceConformance(t *testing.T) {
	for _, p := range []int{2, 3} {
		t.Run("RESP"+strconv.Itoa(p), func(t *testing.T) {
			rdb := client(t, p)
			c := newCleanup(t, rdb)
			resource.Run(t, resource.Harness{
				Resource: func(t *testing.T) resource.Resource { return kitResource{t, rdb, c} },
				Tokens64: true, // decimal strings: every 64-bit token
			})
		})
	}
}

func uniqueResource(t *testing.T) string {
	return "fencelock-kit-test:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":" + t.Name()
}

// fence returns the fence hash of resource.
func fence(t *testing.T, rdb *redis.Client, resource string) map[string]string {
	t.Helper()
	k, err := redisfence.FenceKey(resource)
	if err != nil {
		t.Fatal(err)
	}
	m, err := rdb.HGetAll(ctxT(t), k).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Tokens past 2^53, up to 2^64-1, are compared and recorded exactly: one
// apart is enough to order them, and the refusal reports the exact
// highest token.
func TestTokensPast2To53AreExact(t *testing.T) {
	ctx := ctxT(t)
	rdb := client(t, 0)
	c := newCleanup(t, rdb)
	res := uniqueResource(t)
	set := func(v string) redisfence.Cmd {
		return redisfence.Cmd{Name: "SET", Keys: []string{c.key(t, res, ":value")}, Args: []any{v}}
	}
	steps := []struct {
		token  fencelock.Token
		holder string
		accept bool
	}{
		{1<<53 + 1, "a", true},
		{1 << 53, "b", false},
		{1<<53 + 2, "b", true},
		{math.MaxUint64 - 1, "c", true},
		{math.MaxUint64 - 2, "d", false},
		{math.MaxUint64, "d", true},
		{math.MaxUint64, "e", false},
		{math.MaxUint64 - 1, "c", false},
	}
	var high fencelock.Token
	for i, s := range steps {
		_, err := redisfence.Do(ctx, rdb, res, s.token, s.holder, set(strconv.Itoa(i)))
		var se *fencelock.StaleTokenError
		switch {
		case s.accept && err != nil:
			t.Fatalf("step %d: token %d: %v; want accepted", i, s.token, err)
		case !s.accept && !errors.As(err, &se):
			t.Fatalf("step %d: token %d: err = %v; want a *fencelock.StaleTokenError", i, s.token, err)
		case !s.accept && se.Highest != high:
			t.Fatalf("step %d: StaleTokenError.Highest = %d; want %d exactly", i, se.Highest, high)
		}
		if s.accept {
			high = s.token
		}
		if got := fence(t, rdb, res)["token"]; got != strconv.FormatUint(uint64(high), 10) {
			t.Fatalf("step %d: recorded token %s; want %d", i, got, high)
		}
	}
}

// A fenced write of several commands runs them all, in order, with their
// replies; a refused one runs none of them.
func TestSeveralCommandsRunAsOneWrite(t *testing.T) {
	for _, p := range []int{2, 3} {
		t.Run("RESP"+strconv.Itoa(p), func(t *testing.T) {
			ctx := ctxT(t)
			rdb := client(t, p)
			c := newCleanup(t, rdb)
			res := uniqueResource(t)
			balance, history, meta := c.key(t, res, ":balance"), c.key(t, res, ":history"), c.key(t, res, ":meta")
			write := func(token fencelock.Token, holder, amount string) ([]any, error) {
				return redisfence.Do(ctx, rdb, res, token, holder,
					redisfence.Cmd{Name: "SET", Keys: []string{meta}, Args: []any{holder, "GET"}},
					redisfence.Cmd{Name: "INCRBY", Keys: []string{balance}, Args: []any{amount}},
					redisfence.Cmd{Name: "RPUSH", Keys: []string{history}, Args: []any{"credit " + amount, holder}},
					redisfence.Cmd{Name: "HSET", Keys: []string{meta + ":h"}, Args: []any{"last", holder}},
				)
			}
			c.add(meta + ":h")
			got, err := write(5, "a", "100")
			if err != nil {
				t.Fatal(err)
			}
			if want := []any{nil, int64(100), int64(2), int64(1)}; !reflect.DeepEqual(got, want) {
				t.Fatalf("replies = %#v; want %#v", got, want)
			}
			got, err = write(6, "b", "20")
			if err != nil {
				t.Fatal(err)
			}
			if want := []any{"a", int64(120), int64(4), int64(0)}; !reflect.DeepEqual(got, want) {
				t.Fatalf("replies = %#v; want %#v", got, want)
			}
			if _, err := write(5, "a", "1000"); !errors.Is(err, fencelock.ErrStaleToken) {
				t.Fatalf("token 5 after 6: err = %v; want ErrStaleToken", err)
			}
			if v, _ := rdb.Get(ctx, balance).Result(); v != "120" {
				t.Errorf("balance = %s; want 120 (a refused write runs none of its commands)", v)
			}
			if v, _ := rdb.Get(ctx, meta).Result(); v != "b" {
				t.Errorf("meta = %s; want b", v)
			}
			if n, _ := rdb.LLen(ctx, history).Result(); n != 4 {
				t.Errorf("history has %d entries; want 4", n)
			}
		})
	}
}

// A key without the resource's hash tag is refused before anything runs:
// the fence is not recorded and no command runs.
func TestKeyWithoutTheTagIsRefused(t *testing.T) {
	ctx := ctxT(t)
	rdb := client(t, 0)
	c := newCleanup(t, rdb)
	res := uniqueResource(t)
	good := c.key(t, res, ":a")
	for _, bad := range []string{"no-tag:" + res, "{other}:" + res, "{}" + res} {
		c.add(bad)
		_, err := redisfence.Do(ctx, rdb, res, 1, "a",
			redisfence.Cmd{Name: "SET", Keys: []string{good}, Args: []any{"x"}},
			redisfence.Cmd{Name: "SET", Keys: []string{bad}, Args: []any{"x"}})
		var he *redisfence.HashTagError
		if !errors.Is(err, redisfence.ErrHashTag) || !errors.As(err, &he) || he.Key != bad {
			t.Fatalf("key %q: err = %v; want a *HashTagError naming it", bad, err)
		}
		if errors.Is(err, fencelock.ErrStaleToken) {
			t.Errorf("a HashTagError matches ErrStaleToken")
		}
	}
	if n, _ := rdb.Exists(ctx, good).Result(); n != 0 {
		t.Error("a command ran")
	}
	if m := fence(t, rdb, res); len(m) != 0 {
		t.Errorf("fence recorded: %v", m)
	}
}

// A command that fails when run stops the script with a *CommandError
// naming it; as the package doc says, what ran before it stays.
func TestFailedCommandIsCommandError(t *testing.T) {
	ctx := ctxT(t)
	rdb := client(t, 0)
	c := newCleanup(t, rdb)
	res := uniqueResource(t)
	a, b := c.key(t, res, ":a"), c.key(t, res, ":b")
	_, err := redisfence.Do(ctx, rdb, res, 3, "h",
		redisfence.Cmd{Name: "SET", Keys: []string{a}, Args: []any{"text"}},
		redisfence.Cmd{Name: "INCR", Keys: []string{a}},
		redisfence.Cmd{Name: "SET", Keys: []string{b}, Args: []any{"never"}})
	var ce *redisfence.CommandError
	if !errors.As(err, &ce) || ce.Index != 1 || ce.Name != "INCR" || !strings.HasPrefix(ce.Message, "ERR ") {
		t.Fatalf("err = %v; want a *CommandError for command 1 (INCR)", err)
	}
	if n, _ := rdb.Exists(ctx, b).Result(); n != 0 {
		t.Error("the command after the failed one ran")
	}
	if m := fence(t, rdb, res); m["token"] != "3" || m["owner"] != "h" {
		t.Errorf("fence = %v; want token 3, owner h", m)
	}
}

func TestTagAndFenceKey(t *testing.T) {
	for _, c := range []struct{ resource, tag, fence string }{
		{"acct:1", "acct:1", "{acct:1}:fencelock:fence:acct:1"},
		{"{acct:1}:balance", "acct:1", "{acct:1}:fencelock:fence:{acct:1}:balance"},
		{"{acct:1}", "acct:1", "{acct:1}:fencelock:fence:{acct:1}"},
		{"a{b", "a{b", "{a{b}:fencelock:fence:a{b"},
		{"{}x", "", ""},
		{"a}b", "", ""},
		{"", "", ""},
	} {
		tag, err := redisfence.Tag(c.resource)
		fk, ferr := redisfence.FenceKey(c.resource)
		if c.tag == "" {
			if !errors.Is(err, redisfence.ErrHashTag) || !errors.Is(ferr, redisfence.ErrHashTag) {
				t.Errorf("Tag(%q) = %q, %v; FenceKey = %v; want a *HashTagError", c.resource, tag, err, ferr)
			}
			continue
		}
		if err != nil || tag != c.tag || ferr != nil || fk != c.fence {
			t.Errorf("Tag(%q) = %q, %v; FenceKey = %q, %v; want %q, %q", c.resource, tag, err, fk, ferr, c.tag, c.fence)
		}
	}
}

// Source, run directly (as redis-cli --eval does), refuses arguments that
// do not follow its layout with an ERR error before anything is written:
// neither the fence nor any command.
func TestSourceRefusesMalformedArgumentsBeforeWriting(t *testing.T) {
	ctx := ctxT(t)
	rdb := client(t, 0)
	c := newCleanup(t, rdb)
	res := uniqueResource(t)
	fk, err := redisfence.FenceKey(res)
	if err != nil {
		t.Fatal(err)
	}
	data := c.key(t, res, ":data")
	for _, tc := range []struct {
		name string
		keys []string
		args []any
	}{
		{"no arguments", []string{fk}, nil},
		{"no count", []string{fk, data}, []any{"5", "a"}},
		{"count not a number", []string{fk, data}, []any{"5", "a", "one", "SET", 1, 1, "v"}},
		{"negative count", []string{fk}, []any{"5", "a", -1}},
		{"an argument short", []string{fk, data}, []any{"5", "a", 1, "SET", 1, 2, "v"}},
		{"an argument over", []string{fk, data}, []any{"5", "a", 1, "SET", 1, 1, "v", "w"}},
		{"a key short", []string{fk}, []any{"5", "a", 1, "SET", 1, 1, "v"}},
		{"a key over", []string{fk, data, data}, []any{"5", "a", 1, "SET", 1, 1, "v"}},
		{"no name", []string{fk, data}, []any{"5", "a", 1, "", 1, 1, "v"}},
		{"count not whole", []string{fk, data}, []any{"5", "a", 1, "SET", 1.5, 1, "v"}},
	} {
		err := rdb.Eval(ctx, redisfence.Source, tc.keys, tc.args...).Err()
		if err == nil || !strings.HasPrefix(err.Error(), "ERR fence.lua: ") {
			t.Errorf("%s: err = %v; want an ERR fence.lua error", tc.name, err)
		}
	}
	if m := fence(t, rdb, res); len(m) != 0 {
		t.Errorf("fence recorded: %v", m)
	}
	if n, _ := rdb.Exists(ctx, data).Result(); n != 0 {
		t.Error("a command ran")
	}
	// The layout given right, the same call is accepted.
	got, err := rdb.Eval(ctx, redisfence.Source, []string{fk, data}, "5", "a", 1, "SET", 1, 1, "v").Slice()
	if err != nil || len(got) != 2 || got[0] != int64(1) {
		t.Fatalf("well-formed call: %v, %v; want {1, OK}", got, err)
	}
}
