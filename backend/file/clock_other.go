//go:build darwin || dragonfly || freebsd || netbsd || openbsd

package file

import (
	"os"
	"time"
)

// reading is one reading of the store's clock.
type reading struct {
	domain string
	ns     int64
}

type clock struct {
	monotonic bool
	domain    string
}

func systemClock() clock { return clock{domain: "realtime"} }

func (c clock) now() reading { return reading{domain: "realtime", ns: time.Now().UnixNano()} }

func fsWarnings(dir string) []string { return nil }

func (b *Backend) closeWatches() {}

// datasync flushes f to stable storage.
func datasync(f *os.File) error { return f.Sync() }
