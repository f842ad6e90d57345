package fencelock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/memory" // mem://
)

// TestOpenUnknownSchemeSaysWhatToDo checks that a URL whose scheme no
// backend registered gets an error a user can act on: the import a known
// scheme needs, the scheme a misspelt one meant, the missing SCHEME:// of
// a URL written without one, and never the password.
func TestOpenUnknownSchemeSaysWhatToDo(t *testing.T) {
	for _, c := range []struct {
		url     string
		want    []string
		notWant []string
	}{
		{"redis://127.0.0.1:6379/0", []string{`import _ "github.com/fencelock/fencelock/backend/redis"`}, []string{"known schemes"}},
		{"zk://127.0.0.1:2181", []string{`"github.com/fencelock/fencelock/backend/zookeeper"`}, nil},
		{"postgress://u:s3cret@h/db", []string{"did you mean postgres://?"}, []string{"s3cret", "known schemes"}},
		{"pg://h/db", []string{"did you mean postgres://?"}, nil},
		{"zookeeper://h:2181", []string{"did you mean zk://?"}, nil},
		{"mongo://h", []string{"did you mean mongodb://?"}, nil},
		{"memory://x", []string{"did you mean mem://?"}, nil},
		{"app:s3cret@db:5432/app", []string{"has no scheme", "SCHEME://", "app:xxxxx@db:5432/app"}, []string{"s3cret"}},
		{"qwertyuiop://h", []string{"known schemes: ", "mem"}, nil},
	} {
		_, err := fencelock.Open(context.Background(), c.url, nil)
		if !errors.Is(err, fencelock.ErrUnknownScheme) {
			t.Errorf("Open(%q) = %v; want ErrUnknownScheme", c.url, err)
			continue
		}
		msg := err.Error()
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("Open(%q): %q lacks %q", c.url, msg, w)
			}
		}
		for _, w := range c.notWant {
			if strings.Contains(msg, w) {
				t.Errorf("Open(%q): %q shows %q", c.url, msg, w)
			}
		}
	}
}
