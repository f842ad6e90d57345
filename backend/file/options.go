package file

import (
	"os"
	"path/filepath"
	"strconv"

	"github.com/fencelock/fencelock/driver"
)

// Options configures a Backend. A nil *Options, and every zero field, means
// the documented default.
type Options struct {
	// Dir is the directory that holds the lock files. It is created if
	// missing (mode 0700 for the default directory, 0777 less the umask
	// otherwise). Default DefaultDir(): private to the current user.
	Dir string

	// NoSync skips the sync to disk after a token is issued. Default false: an
	// acquire or rotation is on disk (the key's file, and the directory
	// when the file is new) before the call returns. Renewals and
	// releases are never synced: locks do not outlive a reboot anyway;
	// what the sync protects is the per-key token counter across a power
	// failure. Without it, tokens
	// still increase through the wall-clock floor (see the package
	// documentation) unless the wall clock is set back.
	NoSync bool
}

// Validate reports an option that cannot be used, as a
// *driver.InvalidOptionError.
func (o *Options) Validate() error {
	if o == nil || o.Dir == "" {
		return nil
	}
	if !filepath.IsAbs(o.Dir) {
		if _, err := filepath.Abs(o.Dir); err != nil {
			return &driver.InvalidOptionError{Option: "Dir", Value: strconv.Quote(o.Dir), Reason: "cannot be made absolute: " + err.Error()}
		}
	}
	return nil
}

// DefaultDir returns the directory used when Options.Dir is empty:
// $XDG_RUNTIME_DIR/fencelock when XDG_RUNTIME_DIR is set to an absolute
// path (a per-user directory on Linux desktops and systemd systems), else
// fencelock-UID in os.TempDir().
func DefaultDir() string {
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "fencelock")
	}
	return filepath.Join(os.TempDir(), "fencelock-"+strconv.Itoa(os.Getuid()))
}
