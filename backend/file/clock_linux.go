package file

import (
	"os"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// reading is one reading of the store's clock.
type reading struct {
	domain string // which clock, and for CLOCK_MONOTONIC which boot
	ns     int64
}

type clock struct {
	monotonic bool
	domain    string
}

const clockMonotonic = 1 // CLOCK_MONOTONIC in <time.h>

func systemClock() clock {
	id, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	bootID := strings.TrimSpace(string(id))
	if err != nil || bootID == "" {
		return clock{domain: "realtime"}
	}
	c := clock{monotonic: true, domain: "monotonic/" + bootID}
	if _, ok := c.monoNow(); !ok {
		return clock{domain: "realtime"}
	}
	return c
}

func (c clock) monoNow() (int64, bool) {
	var ts syscall.Timespec
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 {
		return 0, false
	}
	return ts.Nano(), true
}

func (c clock) now() reading {
	if c.monotonic {
		if ns, ok := c.monoNow(); ok {
			return reading{domain: c.domain, ns: ns}
		}
	}
	return reading{domain: "realtime", ns: time.Now().UnixNano()}
}

// fsWarnings reports file systems on which the directory is a poor home.
func fsWarnings(dir string) []string {
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return nil
	}
	switch uint32(st.Type) {
	case 0x6969: // NFS_SUPER_MAGIC
		return []string{"the lock directory is on NFS: flock(2) over NFS is not reliable and machines do not share a clock; use a local directory"}
	case 0xFF534D42, 0xFE534D42, 0x517B: // CIFS, SMB2, SMB
		return []string{"the lock directory is on a network file system (SMB): use a local directory"}
	case 0x01021994: // TMPFS_MAGIC
		return []string{"the lock directory is on tmpfs: token counters vanish at reboot (tokens still increase through the wall-clock floor)"}
	}
	return nil
}

// datasync flushes f's data (and the metadata needed to read it back, such
// as a changed size) to stable storage: fdatasync(2), which skips the
// journal commit a mere mtime change would cost with fsync.
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
