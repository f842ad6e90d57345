// Package file is fencelock's embedded backend: locks shared by every
// process on one machine, kept in a directory of small files, with no server
// to install. It is the default of the fencelock command.
//
//	b, err := file.New(ctx, &file.Options{Dir: "/var/lib/myapp/locks"})
//	c, err := fencelock.New(b, nil)
//
// or, by URL, after importing the package (its init registers the scheme):
//
//	c, err := fencelock.Open(ctx, "file:///var/lib/myapp/locks", nil)
//
// See https://github.com/fencelock/fencelock/blob/main/docs/backends/file.md
// for the guarantees, the limits and the design.
//
// # URLs
//
// Open, OpenURL and fencelock.Open take
//
//	file:///path/to/dir           an absolute directory
//	file://localhost/path/to/dir  the same
//	file://                       DefaultDir()
//	file:relative/dir             relative to the working directory
//
// for example
//
//	file:///var/lib/myapp/locks?sync=false
//
// The scheme is case-insensitive. The directory is Options.Dir, created
// if missing as New does. The one parameter is sync (default true;
// sync=false sets Options.NoSync). Any other parameter is an error, and
// so are a host other than localhost (the backend is local to one
// machine) and a user or password: a file URL carries no credentials, so
// there is nothing to redact, and a URL refused for carrying them is
// shown through driver.RedactURL all the same. fencelock.Open also accepts
// the engine's parameters (ttl, renew_interval, margin, rotate_every,
// owner, lock_delay, require) and removes them before this package sees the URL.
package file
