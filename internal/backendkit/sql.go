package backendkit

import (
	"fmt"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// CheckIdent accepts the SQL identifiers the SQL backends quote and build
// their statements from: [A-Za-z_][A-Za-z0-9_]*, at most maxLen bytes
// (limit says where that bound comes from). Anything else is an
// *InvalidOptionError for option opt; an empty v is one too, so a backend
// applies its default first.
func CheckIdent(opt, v string, maxLen int, limit string) error {
	bad := func(reason string) error {
		return &driver.InvalidOptionError{Option: opt, Value: strconv.Quote(v), Reason: reason}
	}
	if v == "" {
		return bad("empty")
	}
	if len(v) > maxLen {
		return bad(fmt.Sprintf("%d bytes, longer than %d (%s)", len(v), maxLen, limit))
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9':
			if i == 0 {
				return bad("must not start with a digit")
			}
		default:
			return bad("only letters, digits and underscores are allowed in identifiers")
		}
	}
	return nil
}

// Micros is d in whole microseconds, rounded up: the unit the SQL
// backends store times and TTLs in, never shorter than asked.
func Micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// FromMicros is a remaining time in microseconds as a Duration, zero if
// it is not positive.
func FromMicros(us int64) time.Duration {
	if us <= 0 {
		return 0
	}
	return time.Duration(us) * time.Microsecond
}

// OrNil returns md, or nil (SQL NULL) when it is empty: nil and empty
// metadata are alike.
func OrNil(md []byte) []byte {
	if len(md) == 0 {
		return nil
	}
	return md
}
