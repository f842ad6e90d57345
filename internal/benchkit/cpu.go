package benchkit

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// CPUFunc reports the CPU time (user and system) a server has used so far,
// and false if it cannot tell.
type CPUFunc func() (time.Duration, bool)

// ProcessCPU returns the CPUFunc of process pid together with its
// descendants and the members of its process group (a server's worker
// processes), including the children they have reaped. It reads /proc, so
// it can tell on Linux only.
func ProcessCPU(pid int) CPUFunc {
	return func() (time.Duration, bool) { return treeCPU(pid, -1) }
}

// TestenvCPU returns the ProcessCPU of the server that scripts/testenv
// started for backend name ("etcd", "postgres", ...), found by its pid file
// in $FENCELOCK_TESTENV_STATE, or nil if there is none. Use it only when the
// benchmark talks to that server.
func TestenvCPU(name string) CPUFunc {
	state := os.Getenv("FENCELOCK_TESTENV_STATE")
	if state == "" {
		return nil
	}
	raw, err := os.ReadFile(state + "/" + name + "/pid")
	if err != nil {
		return nil
	}
	f := strings.Fields(string(raw)) // "PID START", START in clock ticks since boot
	if len(f) != 2 {
		return nil
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return nil
	}
	return func() (time.Duration, bool) { return treeCPU(pid, start) }
}

// procStat is what treeCPU needs of /proc/PID/stat.
type procStat struct {
	ppid, pgrp int
	cpu        int64 // utime + stime + cutime + cstime, in clock ticks
	start      int64 // clock ticks after boot
}

func readStat(pid string) (procStat, bool) {
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return procStat{}, false
	}
	f := strings.Fields(s[i+2:]) // from field 3, the state
	if len(f) < 20 {
		return procStat{}, false
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	return procStat{ppid: int(n(1)), pgrp: int(n(2)), cpu: n(11) + n(12) + n(13) + n(14), start: n(19)}, true
}

// treeCPU sums the CPU of pid, its descendants and its process group; false
// if pid does not run, or (start >= 0) is not the process started then.
func treeCPU(pid int, start int64) (time.Duration, bool) {
	root, ok := readStat(strconv.Itoa(pid))
	if !ok || (start >= 0 && root.start != start) {
		return 0, false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	stats := map[int]procStat{}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(e.Name()); ok {
			stats[p] = st
			children[st.ppid] = append(children[st.ppid], p)
		}
	}
	seen := map[int]bool{pid: true}
	queue := []int{pid}
	for p, st := range stats {
		if st.pgrp == pid && !seen[p] {
			seen[p] = true
			queue = append(queue, p)
		}
	}
	var ticks int64
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		ticks += stats[p].cpu
		for _, c := range children[p] {
			if !seen[c] {
				seen[c] = true
				queue = append(queue, c)
			}
		}
	}
	return time.Duration(ticks) * (time.Second / 100), true // USER_HZ
}
