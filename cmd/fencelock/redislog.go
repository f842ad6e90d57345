package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/driver"
)

// go-redis logs every failed dial of its connection pool to stderr by
// itself. fencelock reports failures in its own words, so those lines are
// shown only with --verbose, and redacted with the URLs in use.
var (
	redisVerbose atomic.Bool
	redisURLs    atomic.Pointer[[]string]
	redisOut     atomic.Pointer[io.Writer]
)

type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if redisVerbose.Load() {
		msg := fmt.Sprintf(format, v...)
		if p := redisURLs.Load(); p != nil {
			for _, raw := range *p {
				msg = driver.RedactText(msg, raw)
			}
		}
		w := io.Writer(os.Stderr)
		if p := redisOut.Load(); p != nil {
			w = *p
		}
		fmt.Fprintln(w, msg)
	}
}

func init() { redis.SetLogger(redisLogger{}) }

// setLibraryVerbose makes client libraries' own logs visible (--verbose),
// on w, with the credentials of rawURL (added to those of earlier calls)
// redacted.
func setLibraryVerbose(v bool, rawURL string, w io.Writer) {
	redisOut.Store(&w)
	for {
		old := redisURLs.Load()
		var urls []string
		if old != nil {
			urls = append(urls, *old...)
		}
		urls = append(urls, rawURL)
		if redisURLs.CompareAndSwap(old, &urls) {
			break
		}
	}
	redisVerbose.Store(v)
}
