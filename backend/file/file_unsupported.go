//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package file

import (
	"context"
	"errors"

	"github.com/fencelock/fencelock/driver"
)

// Backend is unavailable on this system: the file backend needs flock(2)
// (Linux, macOS, the BSDs).
type Backend struct{ driver.Backend }

// New returns an error wrapping driver.ErrUnsupported: the file backend
// needs flock(2), which this system lacks.
func New(ctx context.Context, opts *Options) (*Backend, error) {
	return nil, errors.Join(driver.ErrUnsupported, errors.New("file: the file backend needs flock(2): Linux, macOS or a BSD"))
}
