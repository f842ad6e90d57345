//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package file_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/file"
	"github.com/fencelock/fencelock/driver"
)

func BenchmarkRenew(b *testing.B) {
	ctx := context.Background()
	be, err := file.New(ctx, &file.Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	g, err := be.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := be.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	for _, sync := range []bool{true, false} {
		b.Run(fmt.Sprintf("sync=%v", sync), func(b *testing.B) {
			be, err := file.New(ctx, &file.Options{Dir: b.TempDir(), NoSync: !sync})
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				g, err := be.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Minute})
				if err != nil {
					b.Fatal(err)
				}
				if err := be.Release(ctx, g); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
