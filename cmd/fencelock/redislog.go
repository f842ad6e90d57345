package main

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// go-redis logs every failed dial of its connection pool to stderr by
// itself. fencelock reports failures in its own words, so those lines are
// shown only with --verbose.
var redisVerbose atomic.Bool

type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if redisVerbose.Load() {
		fmt.Fprintf(os.Stderr, format+"\n", v...)
	}
}

func init() { redis.SetLogger(redisLogger{}) }

// setLibraryVerbose makes client libraries' own logs visible (--verbose).
func setLibraryVerbose(v bool) { redisVerbose.Store(v) }
