//go:build !unix

package main

import (
	"os"
	"os/exec"
)

var forwardedSignals = []os.Signal{os.Interrupt}

var (
	sigTERM os.Signal = os.Kill
	sigKILL os.Signal = os.Kill
)

func terminating(s os.Signal) bool                       { return true }
func fromTerminal(s os.Signal) bool                      { return false }
func signalNumber(s os.Signal) int                       { return 2 }
func setProcAttr(cmd *exec.Cmd, group bool)              {}
func signalChild(p *os.Process, s os.Signal, group bool) { _ = p.Signal(s) }
func signaled(ps *os.ProcessState) (int, bool)           { return 0, false }
func stdinIsTerminal() bool                              { return false }
