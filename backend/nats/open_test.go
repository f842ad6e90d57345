package nats

import (
	"context"
	"errors"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/deadstore"
)

// TestURLRefusedWithTypedError: every URL the backend cannot use is an
// *driver.InvalidOptionError before anything is dialled, and its text
// never shows the secret.
func TestURLRefusedWithTypedError(t *testing.T) {
	const secret = "Hunter2s3cret"
	for _, raw := range []string{
		"nats://h:4222?bucket=a&bucket=b",                // repeated
		"nats://h:4222?bucket=a.b",                       // not a bucket name
		"nats://h:4222?replicas=7",                       // out of range
		"nats://h:4222?storage=disk",                     // unknown storage
		"nats://h:4222?nosuch=1",                         // unknown parameter
		"nats://h:4222/path",                             // a path
		"nats://h:99999",                                 // bad port
		"nats://h:4222?ca_file=/x",                       // a TLS parameter on nats://
		"nats://" + secret + "@h:4222",                   // a user name alone (a token) would be shown
		"nats://u:" + secret + "@h:4222?token=" + secret, // two credentials
		"nats+tls://h:4222?cert_file=/c",                 // cert without key
		"nats://h:4222?connect_timeout=0s",
		"nats://h:4222?token=" + secret + "&token=x" + secret,
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, err = OpenURL(context.Background(), u)
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("OpenURL(%s) = %v; want an *driver.InvalidOptionError", driver.RedactURL(raw), err)
			continue
		}
		if strings.Contains(err.Error(), secret) && !strings.Contains(raw, secret+"@") {
			t.Errorf("OpenURL(%s): the error shows the secret: %v", driver.RedactURL(raw), err)
		}
	}
}

// TestVersionCheck: servers before 2.11 lack per-key TTLs and are refused.
func TestVersionCheck(t *testing.T) {
	for v, want := range map[string]bool{"2.9.25": false, "2.10.29": false, "2.11.0": true, "2.11.0-RC.1": true, "2.15.2": true, "3.0.0": true, "v2.12.1": true} {
		if got := atLeast(v, minServer); got != want {
			t.Errorf("atLeast(%q, %q) = %v, want %v", v, minServer, got, want)
		}
	}
}

// TestHandleBindsOwner: a grant whose owner was changed (a forged or
// copied grant) is not trusted on its handle.
func TestHandleBindsOwner(t *testing.T) {
	h := handle{owner: ownerHash("a"), seq: 7, native: 5, off: 2, foff: 2, md: []byte("m")}
	g := driver.Grant{Key: "k", Owner: "a", Token: 7, Handle: h.String()}
	if got, ok := grantHandle(g); !ok || got.seq != 7 || string(got.md) != "m" {
		t.Fatalf("grantHandle of its own grant = %+v, %v", got, ok)
	}
	g.Owner = "b"
	if _, ok := grantHandle(g); ok {
		t.Fatal("a grant with another owner is trusted on its handle")
	}
	g.Owner, g.Token = "a", 8
	if _, ok := grantHandle(g); ok {
		t.Fatal("a grant with another token is trusted on its handle")
	}
}

// TestOpenRefusedConnectionFailsAtOnce: Open on an address where nothing
// listens fails within a second, naming the refused connection (the
// client's own error says only that no server was available).
func TestOpenRefusedConnectionFailsAtOnce(t *testing.T) {
	u := "nats://app:" + "Hunter2s3cret" + "@" + deadstore.RefusingAddr(t)
	deadstore.RefusedOpen{
		Open:  func(ctx context.Context) (io.Closer, error) { return Open(ctx, u) },
		Bound: time.Second,
		Refused: func(err error) bool {
			return deadstore.IsRefusal(err) && !strings.Contains(err.Error(), "Hunter2s3cret")
		},
		Want: "the refused connection, without the password",
	}.Check(t)
}

// TestReplicasTheServerCannotPlace: replicas=3 on a server outside a
// cluster is an *driver.InvalidOptionError naming Replicas and the fix,
// and creates no bucket.
func TestReplicasTheServerCannotPlace(t *testing.T) {
	u := testURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Open(ctx, u+"&replicas=3")
	var oe *driver.InvalidOptionError
	if !errors.As(err, &oe) || oe.Option != "Replicas" || !strings.Contains(err.Error(), "replicas=1") {
		t.Fatalf("Open with replicas=3 on one server = %v; want an *driver.InvalidOptionError for Replicas saying to use replicas=1", err)
	}
	b := openTest(t, u) // creates the bucket: it did not exist
	if b.cfg.Replicas != 1 {
		t.Fatalf("the bucket has %d replicas after the refused Open; want 1 (a fresh one)", b.cfg.Replicas)
	}
}
