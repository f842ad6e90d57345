package file

import (
	"context"
	"net/url"
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

// Open opens a Backend from a URL:
//
//	file:///path/to/dir          an absolute directory
//	file://localhost/path/to/dir the same
//	file://                      DefaultDir()
//	file:relative/dir            a directory relative to the working directory
//
// The only query parameter is sync (default true; sync=false sets
// Options.NoSync). The engine's parameters (ttl, renew_interval, …) are
// handled by fencelock.Open before the URL reaches this package.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "cannot be parsed")
	}
	return OpenURL(ctx, u)
}

// OpenURL is Open for a parsed URL (scheme file).
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	if u.Scheme != "file" {
		return nil, &driver.InvalidOptionError{Option: "URL", Value: driver.RedactURL(u.String()), Reason: "scheme must be file"}
	}
	if u.Host != "" && u.Host != "localhost" {
		return nil, &driver.InvalidOptionError{Option: "URL", Value: driver.RedactURL(u.String()), Reason: "the file backend is local to one machine: the host must be empty or localhost (file:///path/to/dir)"}
	}
	if u.User != nil {
		return nil, &driver.InvalidOptionError{Option: "URL", Value: driver.RedactURL(u.String()), Reason: "file URLs take no user or password"}
	}
	p := driver.NewParams(u)
	sync := p.Bool("sync", true)
	if err := p.Err(); err != nil {
		return nil, err
	}
	dir := u.Path
	if u.Opaque != "" {
		dir = u.Opaque
	}
	return New(&Options{Dir: dir, NoSync: !sync})
}
