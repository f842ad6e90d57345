package zookeeper

import (
	"context"
	"net/url"

	"github.com/fencelock/fencelock"
)

func init() {
	fencelock.Register("zk", func(ctx context.Context, u *url.URL) (fencelock.Backend, error) {
		return OpenURL(ctx, u)
	})
}
