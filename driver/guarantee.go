package driver

import (
	"context"
	"strconv"
	"strings"
)

// Guarantee names a property a deployment may require of its store
// (fencelock.Options.Require, the URL parameter require=, the fencelock
// command's --require). A backend reports each one as measured on the
// live server (Guarantor); fencelock.Open refuses a backend that does not
// meet every required one.
type Guarantee string

// The guarantees, listed once. Their names are stable: they appear in
// URLs, flags and JSON.
const (
	// DurableTokens: fencing tokens (and lock records) survive a restart
	// or crash of the store's server: an acknowledged token is on disk
	// before the grant returns, so no later grant repeats it. Redis needs
	// appendonly yes and appendfsync always; PostgreSQL fsync and
	// synchronous_commit on; MongoDB journaled writes.
	DurableTokens Guarantee = "durable-tokens"
	// Failover: tokens and locks survive the loss of the store's primary
	// or leader: every acknowledged grant is on a majority (or a
	// synchronous standby) that takes over. Met by an etcd or ZooKeeper
	// ensemble of three or more members, PostgreSQL with a synchronous
	// standby, MongoDB replica sets with w:majority and journaling, Redis
	// only with grants that wait for every replica (wait_replicas); never
	// by a single server.
	Failover Guarantee = "failover"
	// ServerClock: lock expiry is judged by one clock that every holder
	// shares (the store server's, or the one machine's for in-process and
	// file stores), never by the clients' wall clocks.
	ServerClock Guarantee = "server-clock"
	// PushedLoss: the store tells a holder that its lock is gone (a watch,
	// a session expiry) instead of the holder learning it only at its
	// next renewal (driver.LossNotifier).
	PushedLoss Guarantee = "pushed-loss"
	// FIFO: contenders for a held key are queued in the store and granted
	// it in arrival order (driver.Waiter), rather than racing on each
	// release.
	FIFO Guarantee = "fifo"
	// FencedSemaphores: every permit of a fencelock.Semaphore carries a
	// fencing token that strictly increases per slot key, so a resource can
	// refuse a paused permit holder's late writes.
	FencedSemaphores Guarantee = "fenced-semaphores"
)

// AllGuarantees lists every Guarantee, in the order documentation and
// fencelock doctor show them.
var AllGuarantees = []Guarantee{DurableTokens, Failover, ServerClock, PushedLoss, FIFO, FencedSemaphores}

// Measurement is what a backend found about one guarantee on the live
// server.
type Measurement struct {
	// Met reports whether the guarantee holds as deployed. Unknown (the
	// settings could not be read) is not met.
	Met bool
	// Observed is the configuration the judgement rests on, as read from
	// the server, e.g. "appendonly=no, appendfsync=everysec". It never
	// holds a credential.
	Observed string
	// Fix is the setting or deployment that would meet the guarantee,
	// e.g. "set appendonly yes and appendfsync always"; empty when Met.
	Fix string
}

// Guarantor is implemented by backends that measure the guarantees of the
// server they are connected to. Guarantees queries the server (its
// configuration, its replication, its membership) within ctx and returns
// one Measurement per guarantee it can judge; the engine judges the rest
// from the backend's interfaces (FIFO by Waiter, PushedLoss by
// LossNotifier, FencedSemaphores by its own Semaphore) and reports any
// other as unknown, hence not met. A failure to reach the server is the
// returned error; a setting the server refuses to show is a Measurement
// with Met false that says so.
type Guarantor interface {
	Guarantees(ctx context.Context) (map[Guarantee]Measurement, error)
}

// ParseGuarantees parses a comma-separated list of guarantee names (the
// URL parameter require=, the --require flag). Blanks around names and
// empty items are ignored; duplicates are kept once. An unknown name is an
// *InvalidOptionError for option that names the one probably meant and
// lists the known ones.
func ParseGuarantees(option, list string) ([]Guarantee, error) {
	var out []Guarantee
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		g := Guarantee(strings.ToLower(name))
		if err := CheckGuarantee(option, g); err != nil {
			return nil, err
		}
		dup := false
		for _, h := range out {
			dup = dup || h == g
		}
		if !dup {
			out = append(out, g)
		}
	}
	return out, nil
}

// CheckGuarantee returns an *InvalidOptionError for option if g is not one
// of AllGuarantees, naming the one probably meant.
func CheckGuarantee(option string, g Guarantee) error {
	names := make([]string, len(AllGuarantees))
	for i, k := range AllGuarantees {
		if g == k {
			return nil
		}
		names[i] = string(k)
	}
	reason := "unknown guarantee"
	if guess := closest(string(g), names); guess != "" {
		reason += "; did you mean " + guess + "?"
	}
	reason += "; known: " + strings.Join(names, ", ")
	return &InvalidOptionError{Option: option, Value: strconv.Quote(string(g)), Reason: reason}
}
