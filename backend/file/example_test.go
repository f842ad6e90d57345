//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package file_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/file"
)

// Two clients, as two processes would have, share one lock directory.
func Example() {
	dir, err := os.MkdirTemp("", "fencelock-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	a, err := fencelock.Open(ctx, "file://"+dir, nil) // what a process does
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	bb, err := file.New(ctx, &file.Options{Dir: dir}) // the same, without a URL
	if err != nil {
		log.Fatal(err)
	}
	b, err := fencelock.New(bb, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	l, err := a.TryAcquire(ctx, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "jobs/nightly")
	fmt.Println("second holder refused:", err != nil)
	first := l.Token()
	l.Release(ctx)

	l2, err := b.TryAcquire(ctx, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("token increased:", l2.Token() > first)
	l2.Release(ctx)
	// Output:
	// second holder refused: true
	// token increased: true
}
