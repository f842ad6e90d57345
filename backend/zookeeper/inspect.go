package zookeeper

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

// Inspect implements driver.Backend (see inspectKey).
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	info, err := b.inspectKey(ctx, key)
	if err != nil {
		return driver.Info{}, err
	}
	return b.tokens().Info(ctx, info)
}

// inspectKey is Inspect (floor.go) on native tokens. Remaining is always zero: the lock
// lives as long as its holder's session.
func (b *Backend) inspectKey(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	if err := b.sweep(ctx); err != nil {
		return driver.Info{}, err
	}
	if b.pendingUnder(b.parent(key)) {
		return driver.Info{}, b.pendingError()
	}
	return b.inspect(ctx, key)
}

func (b *Backend) inspect(ctx context.Context, key string) (driver.Info, error) {
	node, data, st, err := b.holder(ctx, b.parent(key))
	if err != nil || node == "" {
		return driver.Info{Key: key}, err
	}
	owner, md := parseData(data)
	return driver.Info{Key: key, Owner: owner, Token: driver.Token(st.Mzxid), Metadata: md}, nil
}

// List implements driver.Backend (see list).
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	infos, err := b.list(ctx, prefix)
	if err != nil {
		return nil, err
	}
	return b.tokens().Infos(ctx, infos)
}

// list is List (floor.go) on native tokens. It reads the key znodes under the root
// and the holder of each (up to 16 at a time, pipelined on the session).
func (b *Backend) list(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	names, _, err := b.conn.Children(ctx, b.root)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, n := range names {
		if k, ok := unescapeKey(n); ok && strings.HasPrefix(k, prefix) && driver.ValidateKey(k) == nil {
			keys = append(keys, k)
		}
	}
	infos := make([]driver.Info, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			infos[i], errs[i] = b.inspect(ctx, k)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := infos[:0]
	for i, in := range infos {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if in.Locked() {
			out = append(out, in)
		}
	}
	return out, nil
}
