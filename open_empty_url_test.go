package fencelock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencelock/fencelock"
)

// TestOpenEmptyURLErrorQuotesTheURL checks that Open of an empty or
// blank URL says so with the URL quoted ("invalid URL \"\": empty"), not
// with a gap where the URL would be ("invalid URL : empty").
func TestOpenEmptyURLErrorQuotesTheURL(t *testing.T) {
	for _, raw := range []string{"", "  "} {
		_, err := fencelock.Open(context.Background(), raw, nil)
		if !errors.Is(err, fencelock.ErrInvalidOption) {
			t.Fatalf("Open(%q): %v, want an error matching ErrInvalidOption", raw, err)
		}
		want := `fencelock: invalid URL "` + raw + `": empty: give a backend URL such as redis://HOST:6379/0 or file:///DIR`
		if got := err.Error(); got != want {
			t.Errorf("Open(%q):\n got %s\nwant %s", raw, got, want)
		}
	}
}
