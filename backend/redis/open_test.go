package redis

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

func parse(t *testing.T, raw string) (goredis.UniversalClient, *Options, error) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("url.Parse(%q): %v", raw, err)
	}
	c, o, err := clientFromURL(u)
	if c != nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, o, err
}

func TestURLForms(t *testing.T) {
	c, o, err := parse(t, "redis://u:secret@db.example:6380/3?prefix=app:locks&dial_timeout=2s&pool_size=7")
	if err != nil {
		t.Fatal(err)
	}
	single := c.(*goredis.Client).Options()
	if single.Addr != "db.example:6380" || single.DB != 3 || single.Username != "u" || single.Password != "secret" ||
		single.DialTimeout != 2*time.Second || single.PoolSize != 7 || single.TLSConfig != nil || o.Prefix != "app:locks" {
		t.Errorf("redis URL parsed as %+v, prefix %q", single, o.Prefix)
	}

	c, _, err = parse(t, "rediss://db.example:6380")
	if err != nil {
		t.Fatal(err)
	}
	if c.(*goredis.Client).Options().TLSConfig == nil {
		t.Error("rediss URL without TLS")
	}

	c, o, err = parse(t, "redis+cluster://u:pw@h1:7000,h2:7001,h3:7002?read_timeout=1s&skip_checks=true")
	if err != nil {
		t.Fatal(err)
	}
	cl, ok := c.(*goredis.ClusterClient)
	if !ok {
		t.Fatalf("redis+cluster gave %T", c)
	}
	co := cl.Options()
	if strings.Join(co.Addrs, ",") != "h1:7000,h2:7001,h3:7002" || co.Password != "pw" || co.ReadTimeout != time.Second || !o.SkipChecks || o.Prefix != DefaultPrefix {
		t.Errorf("cluster URL parsed as addrs %v password %q read timeout %v, opts %+v", co.Addrs, co.Password, co.ReadTimeout, o)
	}

	if _, _, err = parse(t, "redis+sentinel://u:pw@s1:26379,s2:26380/mymaster/2?sentinel_password=spw&dial_timeout=1s"); err != nil {
		t.Fatal(err)
	}
}

// TestContextTimeoutEnabled: every client made from a URL honours its
// calls' context deadlines (go-redis's ContextTimeoutEnabled), even when
// the URL asks otherwise.
func TestContextTimeoutEnabled(t *testing.T) {
	for _, raw := range []string{
		"redis://h:6379/0",
		"redis+sentinel://s1:26379,s2:26380/mymaster",
		"redis+sentinel://s1:26379/mymaster?context_timeout_enabled=false",
	} {
		c, _, err := parse(t, raw)
		if err != nil {
			t.Fatal(err)
		}
		if !c.(*goredis.Client).Options().ContextTimeoutEnabled {
			t.Errorf("%s: ContextTimeoutEnabled is off", raw)
		}
	}
	c, _, err := parse(t, "redis+cluster://h1:7000,h2:7001")
	if err != nil {
		t.Fatal(err)
	}
	if !c.(*goredis.ClusterClient).Options().ContextTimeoutEnabled {
		t.Error("cluster: ContextTimeoutEnabled is off")
	}
}

func TestSentinelOptions(t *testing.T) {
	u, _ := url.Parse("redis+sentinel://u:pw@s1:26379,s2:26380/mymaster/2?sentinel_password=spw")
	// Reach into the parser the way clientFromURL does, to see the
	// FailoverOptions (a failover *Client does not expose them).
	c, _, err := clientFromURL(u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	o := c.(*goredis.Client).Options()
	if o.DB != 2 || o.Username != "u" || o.Password != "pw" {
		t.Errorf("sentinel primary options: db %d user %q password %q", o.DB, o.Username, o.Password)
	}
}

func TestBadURLs(t *testing.T) {
	for _, raw := range []string{
		"redis://u:secret@h:1/0?prefxi=x",                  // typo
		"redis://u:secret@h:1/0?prefix=a{b}",               // braces
		"redis://u:secret@h:1/0?prefix=",                   // empty
		"redis://u:secret@h:1/0?dial_timeout=soon",         // go-redis value error
		"redis://u:secret@h:1/0?no_such_go_redis_option=1", // go-redis unknown
		"redis://u:secret@h1:1,h2:2/0",                     // several hosts need sentinel or cluster
		"redis+cluster://u:secret@h1:1,h2:2/0",             // cluster has no db
		"redis+cluster://u:secret@h1:1,,h2:2",              // empty host
		"redis+cluster://u:secret@h1:1?addr=h2:2",          // addr reserved
		"redis+sentinel://u:secret@h1:1",                   // no master name
		"redis+sentinel://u:secret@h1:1/m/0/extra",         // path too long
		"redis+sentinel://u:secret@h1:1/m/0?db=1",          // db twice
		"redis+sentinel://u:secret@h1:1/m?sentinel_password=secret&bogus=1",
		"redis+nope://u:secret@h1:1",
	} {
		_, _, err := parse(t, raw)
		if err == nil {
			t.Errorf("%s: accepted", raw)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("%s: error %v is not ErrInvalidOption", raw, err)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: error shows the password: %v", raw, err)
		}
	}
}

func TestOpenRedactsAndRegisters(t *testing.T) {
	for _, s := range Schemes {
		found := false
		for _, r := range fencelock.Schemes() {
			found = found || r == s
		}
		if !found {
			t.Errorf("scheme %q not registered", s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Nothing listens on port 1: the error must not show the password.
	_, err := fencelock.Open(ctx, "redis://u:secret@127.0.0.1:1/0?dial_timeout=500ms&ttl=5s", nil)
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("Open of an unreachable server = %v", err)
	}
	_, err = Open(ctx, "redis://u:secret@[::1/0")
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("Open of a malformed URL = %v", err)
	}
}

// recordHandler is a slog.Handler that keeps every record.
type recordHandler struct{ n *int }

func (h recordHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error { *h.n++; return nil }
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h recordHandler) WithGroup(string) slog.Handler                 { return h }

// TestSilentByDefault: a Backend opened without a Logger logs nothing,
// not even through slog.Default, while its warnings stay in Describe.
func TestSilentByDefault(t *testing.T) {
	raw := os.Getenv("FENCELOCK_TEST_REDIS")
	if raw == "" {
		t.Skip("FENCELOCK_TEST_REDIS not set")
	}
	n := 0
	prev := slog.Default()
	slog.SetDefault(slog.New(recordHandler{&n}))
	defer slog.SetDefault(prev)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u, _ := url.Parse(raw)
	q := u.Query()
	q.Set("skip_checks", "true") // always one warning
	u.RawQuery = q.Encode()
	b, err := Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if len(b.Describe().Warnings) == 0 {
		t.Fatal("skip_checks gave no warning in Describe")
	}
	if n != 0 {
		t.Fatalf("%d log records through slog.Default without a Logger option", n)
	}
}

// TestBadPortIsInvalidOption: a port out of range is a bad URL
// (ErrInvalidOption), as on every backend, not a failure to connect.
func TestBadPortIsInvalidOption(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, raw := range []string{"redis://:99999", "redis://h:0/0", "redis+sentinel://h:1,h:70000/m", "redis+cluster://h:99999"} {
		_, err := Open(ctx, raw)
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Open(%q) = %v, want ErrInvalidOption", raw, err)
		}
	}
}

// TestOpenUnknownParameterNamesTheLikelyOne checks that a misspelt URL
// parameter gets this backend's parameters, go-redis's and the engine's
// listed, with the one probably meant, on each URL form.
func TestOpenUnknownParameterNamesTheLikelyOne(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"redis://127.0.0.1:1/0?tll=5s", "did you mean ttl?"},
		{"redis://127.0.0.1:1/0?dial_timout=1s", "did you mean dial_timeout?"},
		{"redis://127.0.0.1:1/0?prefx=x", "did you mean prefix?"},
		{"redis+cluster://127.0.0.1:1?pool_sise=3", "did you mean pool_size?"},
		{"redis+sentinel://127.0.0.1:1/m?sentinel_pasword=s3cret", "did you mean sentinel_password?"},
	} {
		_, err := Open(context.Background(), c.url)
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) ||
			!strings.Contains(err.Error(), "prefix") || !strings.Contains(err.Error(), "ttl") {
			t.Errorf("Open(%s) = %v; want ErrInvalidOption listing prefix and ttl, saying %q", c.url, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%s) error shows the secret: %v", c.url, err)
		}
	}
}

// A parameter that go-redis reads (and would read one value of) given
// twice is refused before anything is dialled, like the backend's own
// parameters, and the refusal shows no value: one may be a password.
func TestRepeatedClientParamRefused(t *testing.T) {
	for _, raw := range []string{
		"redis://127.0.0.1:1/0?pool_size=3&pool_size=4",
		"redis://127.0.0.1:1/0?password=s3cret-a&password=s3cret-b",
		"redis+sentinel://127.0.0.1:1/mymaster?dial_timeout=1s&dial_timeout=2s",
	} {
		_, _, err := clientFromURL(mustParse(t, raw))
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "more than once") {
			t.Errorf("%s: %v; want an *InvalidOptionError saying the parameter was given more than once", raw, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows a value: %v", raw, err)
		}
	}
}

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
