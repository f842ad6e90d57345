package redisbench

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/benchkit"
)

// releaseAndPublish is raw's compare-and-delete that also announces the
// release on the key's channel.
var releaseAndPublish = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], '1') return 1 end return 0`)

// rawNotifyRecheck bounds a raw-notify waiter's sleep, in case a release
// announcement was lost (a dropped connection); it never fires in a
// healthy run.
const rawNotifyRecheck = time.Second

// rawNotify is the notify strategy on the raw operations: SET NX PX, and a
// release that deletes and PUBLISHes in one script; a waiter subscribes to
// the key's channel (one pub/sub connection per goroutine, subscribed
// before its first attempt, so no release between an attempt and the wait
// is missed) and retries when a release is announced. Every waiter wakes
// on every release, as with a plain notify.
var rawNotify = benchkit.Lib{Name: "raw-notify", Setup: func(b *testing.B) benchkit.Lockers {
	rdb := client(b)
	try := func(ctx context.Context, key string) (func() error, error) {
		tok := token()
		ok, err := rdb.SetNX(ctx, key, tok, ttl).Result()
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, benchkit.ErrHeld
		}
		return func() error {
			return releaseAndPublish.Run(context.Background(), rdb, []string{key}, tok, key+":released").Err()
		}, nil
	}
	return func(int) (benchkit.LockFunc, benchkit.LockFunc) {
		var (
			ps      *goredis.PubSub
			current string
		)
		b.Cleanup(func() {
			if ps != nil {
				ps.Close()
			}
		})
		wait := func(ctx context.Context, key string) (func() error, error) {
			if ps == nil || current != key {
				if ps != nil {
					ps.Close()
				}
				ps = rdb.Subscribe(ctx, key+":released")
				if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
					return nil, err
				}
				current = key
			}
			msgs := ps.Channel()
			for {
				release, err := try(ctx, key)
				if !errors.Is(err, benchkit.ErrHeld) {
					return release, err
				}
				t := time.NewTimer(rawNotifyRecheck)
				select {
				case <-ctx.Done():
					t.Stop()
					return nil, ctx.Err()
				case <-msgs:
				case <-t.C:
				}
				t.Stop()
			}
		}
		return try, wait
	}
}}
