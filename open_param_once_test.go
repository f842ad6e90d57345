package fencelock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/memory"
)

// TestOpenRefusesEngineParamGivenTwice checks that an engine parameter
// repeated in a URL is refused with an *InvalidOptionError naming it,
// instead of one of its values being taken silently, as a backend's own
// parameters are (driver.Params); require= alone may repeat.
func TestOpenRefusesEngineParamGivenTwice(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"ttl", "renew_interval", "margin", "rotate_every", "lock_delay", "owner"} {
		t.Run(name, func(t *testing.T) {
			c, err := fencelock.Open(ctx, "mem://param-once?"+name+"=10s&"+name+"=20s", nil)
			if err == nil {
				c.Close()
				t.Fatalf("Open accepted %s given twice", name)
			}
			var ioe *fencelock.InvalidOptionError
			if !errors.As(err, &ioe) || !errors.Is(err, fencelock.ErrInvalidOption) {
				t.Fatalf("Open: %v (%T), want an *InvalidOptionError", err, err)
			}
			if msg := err.Error(); !strings.Contains(msg, `"`+name+`"`) || !strings.Contains(msg, "more than once") {
				t.Errorf("Open: %q does not name %q given more than once", msg, name)
			}
		})
	}
	c, err := fencelock.Open(ctx, "mem://param-once?require=server-clock&require=pushed-loss", nil)
	if err != nil {
		t.Fatalf("Open with require= repeated: %v", err)
	}
	c.Close()
}
