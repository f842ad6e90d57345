package etcdfence_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	etcdfence "github.com/fencelock/fencelock/kit/etcd"
)

// TestExample runs Example under a key prefix of its own (the URL's path)
// and checks what it wrote: the account and its fence.
func TestExample(t *testing.T) {
	cli, prefix := testClient(t)
	u, _ := url.Parse(testURLFromEnv(t))
	u.Path = "/" + prefix
	t.Setenv("FENCELOCK_TEST_ETCD", u.String())
	Example()

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/"+prefix+"accounts/1")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "balance=100" {
		t.Fatalf("account after Example: %v, %v; want balance=100", resp, err)
	}
	high, holder, err := etcdfence.Fences{Prefix: "/" + prefix + etcdfence.DefaultPrefix}.Highest(ctx, cli, "accounts/1")
	if err != nil || high < 1 || holder == "" {
		t.Fatalf("fence after Example: %d %q %v; want a recorded token and holder", high, holder, err)
	}
	_, _ = cli.Delete(ctx, "/"+prefix, clientv3.WithPrefix())
}
