//go:build !linux

package main

import "fmt"

// cmdSafety: the safety suite needs Linux (CLOCK_MONOTONIC shared by every
// process, unix sockets, SIGSTOP of contenders via tgkill).
func cmdSafety(e *env, args []string) int {
	fmt.Fprintln(e.stderr, "fencelock safety: runs on Linux only")
	return exitUnavailable
}

// safetyContender does nothing: no contender runs outside Linux.
func safetyContender() {}
