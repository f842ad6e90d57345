package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"
)

// quiet is the go-redis logger this package installs: it drops every
// line. go-redis has one logger for the whole process, and its default
// writes to standard error: its connection pool logs each failed dial
// (about 20 lines in 5s while a server is down), its Sentinel client each
// failed query. A library must not write to its program's standard
// error, and the errors these lines describe reach the caller anyway.
type quiet struct{}

// Printf implements go-redis's logging interface.
func (quiet) Printf(context.Context, string, ...any) {}

// The logger is replaced when the package is initialised, before main
// runs, so that a program's own redis.SetLogger (in main or later) wins:
// the line above applies only to programs that left go-redis's default in
// place. A logger set in the init function of a package initialised
// before this one is replaced; set it again in main.
func init() { goredis.SetLogger(quiet{}) }
