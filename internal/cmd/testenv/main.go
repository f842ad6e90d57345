// Command testenv starts and controls the real database servers of
// fencelock's tests (package internal/testenv; docs/testenv.md).
//
//	out=$(go run ./internal/cmd/testenv up [NAME...]) && eval "$out"
//	go run ./internal/cmd/testenv restart|stop|start|pause|resume|pid NAME
//	go run ./internal/cmd/testenv member CLUSTER VERB [ID]
//	go run ./internal/cmd/testenv status|env
//	eval "$(go run ./internal/cmd/testenv down)"
//
// scripts/testenv runs it with the same arguments. `up` prints only export
// lines on stdout, `down` only unset lines, `env` the export lines of the
// state dir's servers; every diagnostic goes to stderr. pid, member
// pid|addr|leader|members print their answer on stdout. Exit status 3
// means "not running" or "no leader now", 2 a usage error, 1 any other
// failure.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/fencelock/fencelock/internal/testenv"
)

const usage = `usage:
  out=$(scripts/testenv up [NAME...]) && eval "$out"   start servers, set FENCELOCK_TEST_*
  scripts/testenv restart NAME       kill -9 NAME's server, start it again (same port, same data)
  scripts/testenv stop NAME          stop NAME gracefully (port and data kept)
  scripts/testenv start NAME         start a stopped NAME again (same port, same data)
  scripts/testenv pause NAME         SIGSTOP NAME's server, all its processes (a cluster: all members)
  scripts/testenv resume NAME        SIGCONT them again
  scripts/testenv pid NAME           print the PID of NAME's running server
  scripts/testenv member CLUSTER VERB [ID]   one member of a cluster, VERB one of:
      kill ID | start ID | stop ID | restart ID | pause ID | resume ID
      pid ID | addr ID (its client host:port) | leader (ID of the leader/primary)
      members (one line per member: ID STATE PID ADDR) | failover (redisha, postgresha*)
      promote ID (postgresha*: make the standby ID the primary, e.g. after killing the primary)
  scripts/testenv status             show what runs in $FENCELOCK_TESTENV_STATE
  scripts/testenv env                print the export lines of the servers that run there
  eval "$(scripts/testenv down)"     stop all servers of the state dir, remove it

NAME is one of: ` + "%s" + `
(default for up: %s). See docs/testenv.md.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err == nil {
		return
	}
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		fmt.Fprintf(os.Stderr, usage, strings.Join(testenv.Names(), " "), strings.Join(testenv.Defaults, " "))
		os.Exit(2)
	case errors.Is(err, testenv.ErrNotRunning), errors.Is(err, testenv.ErrNoLeader):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	default:
		fmt.Fprintf(os.Stderr, "testenv: ERROR: %s\n", strings.TrimPrefix(err.Error(), "testenv: "))
		os.Exit(1)
	}
}

type usageError string

func (e usageError) Error() string { return string(e) }

func need(args []string, n int, form string) error {
	if len(args) != n {
		return usageError("usage: scripts/testenv " + form)
	}
	return nil
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError("no command")
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "up":
		_, vars, err := testenv.Up(ctx, testenv.Config{
			State: os.Getenv(testenv.StateEnv),
			CI:    testenv.IsCI(),
			Log:   os.Stderr,
			Given: os.Getenv,
		}, args...)
		if err != nil {
			return err
		}
		return testenv.WriteExports(os.Stdout, vars)
	case "down":
		if err := need(args, 0, "down"); err != nil {
			return err
		}
		e, err := testenv.FromEnv()
		if err != nil {
			fmt.Fprintf(os.Stderr, "testenv: no state dir (%s=%s); nothing to stop\n", testenv.StateEnv, os.Getenv(testenv.StateEnv))
			return nil
		}
		e.Log = os.Stderr
		vars, err := e.Down(ctx)
		for _, v := range vars {
			fmt.Printf("unset %s\n", v)
		}
		return err
	case "help", "-h", "--help":
		fmt.Fprintf(os.Stderr, usage, strings.Join(testenv.Names(), " "), strings.Join(testenv.Defaults, " "))
		return nil
	}

	e, err := testenv.FromEnv()
	if err != nil {
		return err
	}
	e.Log = os.Stderr
	switch cmd {
	case "env":
		if err := need(args, 0, "env"); err != nil {
			return err
		}
		return testenv.WriteExports(os.Stdout, e.Exports())
	case "status":
		return e.Status(os.Stdout)
	case "restart", "stop", "start", "pause", "resume", "pid":
		if err := need(args, 1, cmd+" NAME"); err != nil {
			return err
		}
		name := args[0]
		switch cmd {
		case "restart":
			return e.Restart(ctx, name)
		case "stop":
			return e.Stop(ctx, name)
		case "start":
			return e.Start(ctx, name)
		case "pause":
			return e.Pause(ctx, name)
		case "resume":
			return e.Resume(ctx, name)
		default:
			pid, err := e.PID(name)
			if err == nil {
				fmt.Println(pid)
			}
			return err
		}
	case "member":
		return member(ctx, e, args)
	}
	return usageError(fmt.Sprintf("unknown command %q", cmd))
}

func member(ctx context.Context, e *testenv.Env, args []string) error {
	if len(args) < 2 {
		return usageError("usage: scripts/testenv member CLUSTER VERB [ID]")
	}
	name, verb, rest := args[0], args[1], args[2:]
	switch verb {
	case "leader", "members", "failover":
		if err := need(rest, 0, "member "+name+" "+verb); err != nil {
			return err
		}
	case "kill", "start", "stop", "restart", "pause", "resume", "pid", "addr", "promote":
		if err := need(rest, 1, "member "+name+" "+verb+" ID"); err != nil {
			return err
		}
	default:
		return usageError(fmt.Sprintf("unknown member command %q (kill start stop restart pause resume pid addr leader members failover promote)", verb))
	}
	switch verb {
	case "leader":
		id, err := e.Leader(ctx, name)
		if err == nil {
			fmt.Println(id)
		}
		return err
	case "members":
		ms, err := e.Members(name)
		for _, m := range ms {
			pid := "-"
			if m.State != testenv.Stopped {
				pid = strconv.Itoa(m.PID)
			}
			fmt.Printf("%s %s %s %s\n", m.ID, m.State, pid, m.Addr)
		}
		return err
	case "failover":
		return e.Failover(ctx, name)
	}
	id := rest[0]
	switch verb {
	case "kill":
		return e.KillMember(ctx, name, id)
	case "start":
		return e.StartMember(ctx, name, id)
	case "stop":
		return e.StopMember(ctx, name, id)
	case "restart":
		return e.RestartMember(ctx, name, id)
	case "pause":
		return e.PauseMember(ctx, name, id)
	case "resume":
		return e.ResumeMember(ctx, name, id)
	case "promote":
		return e.Promote(ctx, name, id)
	case "pid":
		pid, err := e.MemberPID(name, id)
		if err == nil {
			fmt.Println(pid)
		}
		return err
	default: // addr
		a, err := e.Addr(name, id)
		if err == nil {
			fmt.Println(a)
		}
		return err
	}
}
