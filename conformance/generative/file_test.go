package generative_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/file"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/driver"
)

// TestFile runs the generative mode on the file backend (a directory
// shared by every client, as processes on one machine share it).
func TestFile(t *testing.T) {
	opts := &file.Options{Dir: t.TempDir()}
	generative.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) { return file.New(ctx, opts) },
		TTL:  time.Second,
	}, nil)
}
