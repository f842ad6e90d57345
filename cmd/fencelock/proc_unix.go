//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

const (
	sigTERM = syscall.SIGTERM
	sigKILL = syscall.SIGKILL
)

// terminating reports whether s, received while waiting for the lock,
// abandons the wait.
func terminating(s os.Signal) bool {
	return s == syscall.SIGINT || s == syscall.SIGTERM || s == syscall.SIGHUP || s == syscall.SIGQUIT
}

// fromTerminal reports whether s is one a terminal sends to its whole
// foreground process group (so a child in fencelock's group has it already).
func fromTerminal(s os.Signal) bool { return s == syscall.SIGINT || s == syscall.SIGQUIT }

func signalNumber(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 0
}

// setProcAttr puts the child in a process group of its own (group), and
// where the system allows, makes it die with fencelock.
func setProcAttr(cmd *exec.Cmd, group bool) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	setDeathSignal(cmd.SysProcAttr)
}

// signalChild sends s to the child, or to its whole process group.
func signalChild(p *os.Process, s os.Signal, group bool) {
	n, ok := s.(syscall.Signal)
	if !ok {
		return
	}
	if group {
		if syscall.Kill(-p.Pid, n) == nil {
			return
		}
	}
	_ = p.Signal(n)
}

func signaled(ps *os.ProcessState) (int, bool) {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0, false
	}
	return int(ws.Signal()), true
}
