//go:build unix && !linux && !darwin && !dragonfly && !freebsd && !netbsd && !openbsd

package main

import "syscall"

func setDeathSignal(a *syscall.SysProcAttr) {}

// stdinIsTerminal is not detected on this system: the command always gets
// its own process group.
func stdinIsTerminal() bool { return false }
