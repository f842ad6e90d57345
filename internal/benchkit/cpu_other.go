//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package benchkit

import "time"

// processCPU returns -1: this platform's CPU time is not measured.
func processCPU() time.Duration { return -1 }
