package testenv

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Ports come from this range, below Linux's usual ephemeral range
// (32768-60999), so outgoing connections rarely take them.
const (
	portMin = 15000
	portMax = 31999
)

// FreePort returns a loopback TCP port that nothing on this machine uses
// (no socket of /proc/net/tcp{,6} has it, and 127.0.0.1 can listen on it)
// and that the state dir has not handed out before: the ports a state dir
// handed out are kept in its file .ports, under the lock .ports.lock, so
// servers started in parallel never get the same port.
func FreePort(state string) (int, error) {
	lock, err := os.OpenFile(filepath.Join(state, ".ports.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return 0, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return 0, err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	used := usedPorts()
	portsFile := filepath.Join(state, ".ports")
	b, _ := os.ReadFile(portsFile)
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			used[p] = true
		}
	}
	for range 500 {
		p := portMin + rand.IntN(portMax-portMin+1)
		if used[p] {
			continue
		}
		used[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = l.Close()
		f, err := os.OpenFile(portsFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return 0, err
		}
		_, err = f.WriteString(strconv.Itoa(p) + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return p, err
	}
	return 0, errors.New("testenv: no free port found")
}

// usedPorts returns the local ports of every TCP socket in /proc/net/tcp
// and /proc/net/tcp6 (listening or connected).
func usedPorts() map[int]bool {
	used := map[int]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(string(b), "\n")
		for _, line := range lines[min(1, len(lines)):] {
			fields := strings.Fields(line)
			if len(fields) < 2 {
				continue
			}
			_, hex, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			if p, err := strconv.ParseUint(hex, 16, 16); err == nil {
				used[int(p)] = true
			}
		}
	}
	return used
}
