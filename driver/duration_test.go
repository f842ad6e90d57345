package driver_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// TestParseTTLOneRule checks the rule a TTL written by a person follows,
// in a URL or a flag alike: a duration with a unit, between
// MinConfiguredTTL and MaxTTL; zero and bare numbers are refused with an
// error that says what to write instead.
func TestParseTTLOneRule(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		msg  string
	}{
		{"15s", 15 * time.Second, ""},
		{"1s", time.Second, ""},
		{"1500ms", 1500 * time.Millisecond, ""},
		{"0", 0, "shorter than 1s"},
		{"0s", 0, "shorter than 1s"},
		{"10ms", 0, "shorter than 1s"},
		{"-5s", 0, "shorter than 1s"},
		{"5", 0, "did you mean 5s?"},
		{"", 0, "not a duration (e.g. 1500ms, 15s)"},
		{"soon", 0, "not a duration (e.g. 1500ms, 15s)"},
		{"25h", 0, "longer than the longest lease, 24h"},
	} {
		got, err := driver.ParseTTL("--ttl", c.in)
		if c.msg == "" {
			if err != nil || got != c.want {
				t.Errorf("ParseTTL(%q) = %v, %v; want %v", c.in, got, err, c.want)
			}
			continue
		}
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), "--ttl") {
			t.Errorf("ParseTTL(%q) = %v, %v; want an ErrInvalidOption naming --ttl and saying %q", c.in, got, err, c.msg)
		}
	}
}
