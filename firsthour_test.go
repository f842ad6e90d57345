package fencelock_test

import (
	"context"
	"errors"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/memory" // mem://
)

// The URLs a newcomer really types in the first hour, and what Open must
// answer: one line that says what to do, typed (errors.Is), and never the
// password.

const firstHourSecret = "S3cr3tA"

func checkOpenError(t *testing.T, rawURL string, target error, want ...string) {
	t.Helper()
	_, err := fencelock.Open(context.Background(), rawURL, nil)
	if err == nil {
		t.Errorf("Open(%q) succeeded; want an error", rawURL)
		return
	}
	msg := err.Error()
	if !errors.Is(err, target) {
		t.Errorf("Open(%q): %v; want errors.Is %v", rawURL, err, target)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("Open(%q): %q; want it to contain %q", rawURL, msg, w)
		}
	}
	if strings.Contains(msg, firstHourSecret) {
		t.Errorf("Open(%q) printed the password: %q", rawURL, msg)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("Open(%q): %q is more than one line", rawURL, msg)
	}
}

// TestOpenURLWithoutSchemeGuessesFromThePort checks that a URL written
// without its scheme is told the scheme its port suggests, as a URL to
// copy, in one line without a list of every scheme variant; and that an
// IP:PORT, which url.Parse cannot parse at all, is told it has no scheme
// rather than "cannot be parsed".
func TestOpenURLWithoutSchemeGuessesFromThePort(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"localhost:6379", "did you mean redis://localhost:6379?"},
		{"127.0.0.1:6379/0", "did you mean redis://127.0.0.1:6379/0?"},
		{"app:" + firstHourSecret + "@db:5432/app", "did you mean postgres://app:xxxxx@db:5432/app?"},
		{"app@db:5432/app?password=" + firstHourSecret, "did you mean postgres://app@db:5432/app?password=xxxxx?"},
		{"etcd1:2379", "did you mean etcd://etcd1:2379?"},
		{"zk1:2181", "did you mean zk://zk1:2181?"},
		{"mongo1:27017/db", "did you mean mongodb://mongo1:27017/db?"},
		{"127.0.0.1:25070", "SCHEME is one of postgres, redis"},
		{"junk", "SCHEME is one of postgres, redis"},
	} {
		checkOpenError(t, c.url, fencelock.ErrUnknownScheme, "has no scheme", c.want)
		_, err := fencelock.Open(context.Background(), c.url, nil)
		if err != nil && strings.Contains(err.Error(), "rediss+sentinel") {
			t.Errorf("Open(%q): %q lists every scheme variant", c.url, err)
		}
	}
}

// TestOpenUnknownSchemeListsOnlyTheMainSchemes checks that an unknown
// scheme with no near miss lists one scheme per backend, not every
// variant.
func TestOpenUnknownSchemeListsOnlyTheMainSchemes(t *testing.T) {
	checkOpenError(t, "qwertyuiop://h", fencelock.ErrUnknownScheme, "known schemes: postgres, redis, etcd, zk, mongodb, mysql, nats, file, mem, dual")
	_, err := fencelock.Open(context.Background(), "qwertyuiop://h", nil)
	if err != nil && strings.Contains(err.Error(), "rediss+cluster") {
		t.Errorf("%q lists every scheme variant", err)
	}
}

// TestOpenUnparsableURLNamesTheCauseNotTheSecret checks that a URL
// url.Parse refuses — most often for a password with a character that
// must be percent-encoded — is told how to encode it, without the
// password (url.Parse's own message quotes it as a "port" or an
// "escape").
func TestOpenUnparsableURLNamesTheCauseNotTheSecret(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"postgres://app:" + firstHourSecret + "/x@db/app", "%2F"},
		{"postgres://app:" + firstHourSecret + "#x@db/app", "%23"},
		{"postgres://app:" + firstHourSecret + "?x@db/app", "%3F"},
		{"postgres://app:" + firstHourSecret + "%zz@db/app", "%25"},
		{"postgres://app:" + firstHourSecret + " x@db/app", "%20"},
		{"postgres://db:port/app", "not a port number"},
	} {
		checkOpenError(t, c.url, fencelock.ErrInvalidOption, "cannot be parsed", c.want)
	}
}

// TestOpenURLInQuotesOrSpacesSaysRemoveThem checks that a URL read with
// its quotes (a docker --env-file keeps them) or its newline is told to
// drop them, rather than "cannot be parsed" or a backend's "invalid
// database number", and that an empty URL (an unset variable) says what
// a URL looks like.
func TestOpenURLInQuotesOrSpacesSaysRemoveThem(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{`"mem://quoted"`, "quotes"},
		{`'mem://quoted'`, "quotes"},
		{" mem://spaced", "white space"},
		{"mem://spaced\n", "white space"},
		{"redis://:" + firstHourSecret + "@h:6379/0 ", "white space"},
		{`"redis://:` + firstHourSecret + `@h:6379/0"`, "quotes"},
		{"", "empty"},
	} {
		checkOpenError(t, c.url, fencelock.ErrInvalidOption, c.want)
	}
}

// TestOpenOneSlashAfterSchemeSaysTwo checks that "redis:/host" (a slash
// short), which would reach the backend as a path and come back as an
// "invalid database number", is told the URL it meant.
func TestOpenOneSlashAfterSchemeSaysTwo(t *testing.T) {
	checkOpenError(t, "redis:/127.0.0.1:6379/0", fencelock.ErrInvalidOption, "did you mean redis://127.0.0.1:6379/0?")
	checkOpenError(t, "postgres:/app:"+firstHourSecret+"@db/app", fencelock.ErrInvalidOption, "did you mean postgres://app:xxxxx@db/app?")
}

// passthrough is a backend that, like PostgreSQL's and MongoDB's, hands
// the parameters it does not know to its server or client library, which
// refuses them without knowing the engine's.
func init() {
	fencelock.Register("firsthour-passthrough", func(ctx context.Context, u *url.URL) (fencelock.Backend, error) {
		var names []string
		for name := range u.Query() {
			names = append(names, name)
		}
		sort.Strings(names)
		if len(names) > 0 {
			return nil, &fencelock.InvalidOptionError{Option: "URL parameter", Value: strconv.Quote(names[0]), Reason: "unknown to the server"}
		}
		return nil, errors.New("firsthour-passthrough opens nothing")
	})
}

// TestOpenEngineParameterTypoGuessedForEveryBackend checks that a
// misspelt engine parameter ("tll") is answered "did you mean ttl?" even
// by a backend whose own refusal cannot know the engine's parameters.
func TestOpenEngineParameterTypoGuessedForEveryBackend(t *testing.T) {
	checkOpenError(t, "firsthour-passthrough://h?tll=5s", fencelock.ErrInvalidOption, `"tll"`, "did you mean ttl?")
	checkOpenError(t, "firsthour-passthrough://h?renew_intervall=1s", fencelock.ErrInvalidOption, "did you mean renew_interval?")
	_, err := fencelock.Open(context.Background(), "firsthour-passthrough://h?sslmode=x", nil)
	if err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("a parameter near no engine parameter: %v; want the backend's refusal alone", err)
	}
}
