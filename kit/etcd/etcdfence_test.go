package etcdfence_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance/resource"
	"github.com/fencelock/fencelock/internal/testenv"

	etcdfence "github.com/fencelock/fencelock/kit/etcd"
)

// testClient connects to the etcd of FENCELOCK_TEST_ETCD (an etcd:// URL
// whose host list is the endpoints) and returns a client and a key prefix
// unique to the test, so runs can share the server.
func testClient(t testing.TB) (*clientv3.Client, string) {
	t.Helper()
	raw := testURLFromEnv(t)
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("FENCELOCK_TEST_ETCD=%q: want etcd://host:port[,host:port...]", raw)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(u.Host, ","), DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	prefix := "fencelock-test-" + hex.EncodeToString(rnd[:]) + "/"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = cli.Delete(ctx, prefix, clientv3.WithPrefix())
	})
	return cli, prefix
}

// testURLFromEnv returns FENCELOCK_TEST_ETCD, skipping the test (failing
// it on CI) when it is unset.
func testURLFromEnv(t testing.TB) string {
	t.Helper()
	return testenv.URL(t, "FENCELOCK_TEST_ETCD")
}

// kvResource writes name's value to a data key with Txn, fenced by a
// Fences under its own prefix.
type kvResource struct {
	cli    *clientv3.Client
	fences etcdfence.Fences
	data   string
}

func (r kvResource) Write(ctx context.Context, name string, token fencelock.Token, holder, value string) error {
	_, err := r.fences.Txn(ctx, r.cli, name, token, holder, clientv3.OpPut(r.data+name, value))
	return err
}

func (r kvResource) Read(ctx context.Context, name string) (string, bool, error) {
	resp, err := r.cli.Get(ctx, r.data+name)
	if err != nil || len(resp.Kvs) == 0 {
		return "", false, err
	}
	return string(resp.Kvs[0].Value), true, nil
}

// TestResourceConformance runs the resource conformance suite over Txn
// against a real etcd, with every 64-bit token.
func TestResourceConformance(t *testing.T) {
	cli, prefix := testClient(t)
	r := kvResource{cli: cli, fences: etcdfence.Fences{Prefix: prefix + "fences/"}, data: prefix + "data/"}
	resource.Run(t, resource.Harness{
		Resource: func(t *testing.T) resource.Resource { return r },
		Tokens64: true,
	})
}

// TestRefusalReportsHighestPast2to63 writes tokens past 2^53 and 2^63 up
// to 2^64-1: each is judged exactly, and a refusal reports the exact
// highest token accepted.
func TestRefusalReportsHighestPast2to63(t *testing.T) {
	cli, prefix := testClient(t)
	f := etcdfence.Fences{Prefix: prefix}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	steps := []struct {
		token  fencelock.Token
		accept bool
	}{
		{1<<53 + 1, true},
		{1 << 53, false},
		{1<<63 + 1, true},
		{1 << 63, false},
		{1<<64 - 1, true},
		{1<<64 - 2, false},
	}
	var high fencelock.Token
	for _, s := range steps {
		_, err := f.Txn(ctx, cli, "r", s.token, "h")
		if s.accept {
			if err != nil {
				t.Fatalf("token %d: %v; want accepted", s.token, err)
			}
			high = s.token
			continue
		}
		var stale *fencelock.StaleTokenError
		if !errors.As(err, &stale) || !errors.Is(err, fencelock.ErrStaleToken) {
			t.Fatalf("token %d: %v; want a *fencelock.StaleTokenError", s.token, err)
		}
		if stale.Highest != high || stale.Token != s.token || stale.Resource != "r" {
			t.Fatalf("token %d: refusal %+v; want Highest %d", s.token, stale, high)
		}
	}
	got, holder, err := f.Highest(ctx, cli, "r")
	if err != nil || got != 1<<64-1 || holder != "h" {
		t.Fatalf("Highest = %d, %q, %v; want %d, %q", got, holder, err, fencelock.Token(1<<64-1), "h")
	}
}

// TestNamesSharingAPrefixHaveTheirOwnFences: a resource whose name
// extends another's with what looks like a fence record ("a" and
// "a/00000000000000000009/x") has a fence of its own, so a high token on
// one never refuses a write to the other.
func TestNamesSharingAPrefixHaveTheirOwnFences(t *testing.T) {
	cli, prefix := testClient(t)
	f := etcdfence.Fences{Prefix: prefix}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"a/00000000000000000009/x", "a/", "a0", "a.b"} {
		if _, err := f.Txn(ctx, cli, name, 9, "x"); err != nil {
			t.Fatalf("write token 9 to %q: %v", name, err)
		}
	}
	if _, err := f.Txn(ctx, cli, "a", 5, "y"); err != nil {
		t.Fatalf("write token 5 to \"a\" after token 9 to names sharing its prefix: %v", err)
	}
}

// TestOwnTxnTellsFenceFromOwnCompares: in a transaction of the user's own
// (their compare, Cmps in If, Record in Then, Read in Else), Judge
// returns nil when the user's compare failed and a stale-token error when
// the fence refused; only an accepted token writes.
func TestOwnTxnTellsFenceFromOwnCompares(t *testing.T) {
	cli, prefix := testClient(t)
	f := etcdfence.Fences{Prefix: prefix + "fences/"}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	data := prefix + "data"
	txn := func(token fencelock.Token, holder, wantValue, newValue string) (bool, error) {
		var mine clientv3.Cmp
		if wantValue == "" {
			mine = clientv3.Compare(clientv3.CreateRevision(data), "=", 0)
		} else {
			mine = clientv3.Compare(clientv3.Value(data), "=", wantValue)
		}
		resp, err := cli.Txn(ctx).
			If(append(f.Cmps("acct", token, holder), mine)...).
			Then(append(f.Record("acct", token, holder), clientv3.OpPut(data, newValue))...).
			Else(f.Read("acct")).
			Commit()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Succeeded {
			return true, nil
		}
		return false, f.Judge("acct", token, holder, resp.Responses[0].GetResponseRange().Kvs)
	}
	if ok, err := txn(7, "a", "", "v1"); !ok || err != nil {
		t.Fatalf("first write: ok %v, %v; want accepted", ok, err)
	}
	if ok, err := txn(7, "a", "wrong", "v2"); ok || err != nil {
		t.Fatalf("write with a failing compare of the user's: ok %v, %v; want not applied, Judge nil", ok, err)
	}
	if ok, err := txn(6, "b", "v1", "v3"); ok || !errors.Is(err, fencelock.ErrStaleToken) {
		t.Fatalf("write with a lower token: ok %v, %v; want refused by the fence", ok, err)
	}
	if ok, err := txn(0, "a", "v1", "v4"); ok || !errors.Is(err, fencelock.ErrStaleToken) {
		t.Fatalf("write with token 0: ok %v, %v; want refused by the fence", ok, err)
	}
	resp, err := cli.Get(ctx, data)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
		t.Fatalf("data after refusals = %v, %v; want v1", resp, err)
	}
}
