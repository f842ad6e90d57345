package driver

import (
	"strconv"
	"strings"
	"time"
)

// MinConfiguredTTL is the shortest lease TTL accepted from configuration
// a person writes: a URL's ttl parameter or a command's --ttl flag. A
// lease is renewed every TTL/3 and judged with a TTL/10 margin, so a
// shorter one is lost to an ordinary scheduling or network hiccup.
// Programs that need shorter leases (tests) set the engine's Options.TTL,
// whose floor is MinTTL.
const MinConfiguredTTL = time.Second

// ParseDuration parses the value of a duration option written in a URL or
// on a command line, such as "1500ms" or "15s". A bare number is refused
// with the unit it probably lacks ("5" → "did you mean 5s?"). option names
// the option in the error, e.g. `URL parameter "margin"` or "--ttl".
func ParseDuration(option, value string) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	if err == nil {
		return d, nil
	}
	reason := "not a duration (e.g. 1500ms, 15s)"
	if _, nerr := strconv.ParseFloat(value, 64); nerr == nil && value != "" {
		reason = "not a duration: it needs a unit; did you mean " + value + "s?"
	}
	return 0, &InvalidOptionError{Option: option, Value: strconv.Quote(value), Reason: reason}
}

// ParseTTL parses a lease TTL written in a URL (ttl=) or on a command line
// (--ttl): ParseDuration, then the one rule both follow: at least
// MinConfiguredTTL and at most MaxTTL. Zero is refused like any TTL below
// the floor: to get the default, leave the option out.
func ParseTTL(option, value string) (time.Duration, error) {
	d, err := ParseDuration(option, value)
	if err != nil {
		return 0, err
	}
	switch {
	case d < MinConfiguredTTL:
		return 0, &InvalidOptionError{Option: option, Value: strconv.Quote(value), Reason: "shorter than " +
			MinConfiguredTTL.String() + ", the shortest TTL a lease is reliably kept for (it is renewed every TTL/3, with a TTL/10 margin); " +
			"use " + MinConfiguredTTL.String() + " or more, or leave it out for the default (15s)"}
	case d > MaxTTL:
		return 0, &InvalidOptionError{Option: option, Value: strconv.Quote(value), Reason: "longer than the longest lease, " +
			strings.TrimSuffix(MaxTTL.String(), "0m0s")}
	}
	return d, nil
}

// ParseLockDelay parses a lock delay written in a URL (lock_delay=) or on
// a command line (--lock-delay): ParseDuration, then 0 (none, the
// default) up to MaxTTL.
func ParseLockDelay(option, value string) (time.Duration, error) {
	d, err := ParseDuration(option, value)
	if err != nil {
		return 0, err
	}
	if d < 0 || d > MaxTTL {
		return 0, &InvalidOptionError{Option: option, Value: strconv.Quote(value), Reason: "must be between 0 (no lock delay) and " +
			strings.TrimSuffix(MaxTTL.String(), "0m0s")}
	}
	return d, nil
}
