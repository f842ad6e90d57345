package main

import (
	"syscall"
	"unsafe"
)

// setDeathSignal makes the kernel SIGKILL the child if fencelock dies
// (even by SIGKILL), so that COMMAND never runs on without the lock's
// renewals.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

func stdinIsTerminal() bool {
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
}
