package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencelock/fencelock/driver"
)

// streamConfig is the part of a stream's configuration the backend reads.
type streamConfig struct {
	Storage           string        `json:"storage"`
	Replicas          int           `json:"num_replicas"`
	MaxMsgsPerSubject int64         `json:"max_msgs_per_subject"`
	AllowMsgTTL       bool          `json:"allow_msg_ttl"`
	MarkerTTL         time.Duration `json:"subject_delete_marker_ttl"`
}

// streamInfo is the part of a STREAM.INFO answer the backend reads.
type streamInfo struct {
	Config streamConfig `json:"config"`
	State  struct {
		LastSeq uint64 `json:"last_seq"`
	} `json:"state"`
	Cluster *struct {
		Leader   string `json:"leader"`
		Replicas []struct {
			Name    string `json:"name"`
			Current bool   `json:"current"`
			Offline bool   `json:"offline"`
		} `json:"replicas"`
	} `json:"cluster"`
	TS time.Time `json:"ts"` // the server's clock when it answered
}

// streamInfo asks for the bucket's stream, and notes the server's clock.
func (b *Backend) streamInfo(ctx context.Context) (*streamInfo, error) {
	var si streamInfo
	t0 := time.Now()
	if err := b.apiCall(ctx, "STREAM.INFO."+b.stream, nil, &si); err != nil {
		if isCode(err, errCodeStreamNotFound) {
			return nil, fmt.Errorf("nats: the bucket %q (stream %s) does not exist: it was deleted; open the backend again to create it: %w", b.bucket, b.stream, err)
		}
		return nil, err
	}
	b.clock.observe(t0, time.Now(), si.TS)
	return &si, nil
}

// ensureBucket creates the bucket if it does not exist and checks the
// one that does.
func (b *Backend) ensureBucket(ctx context.Context, o Options) error {
	_, err := b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         o.Bucket,
		Description:    "fencelock locks",
		History:        1,
		Storage:        o.Storage,
		Replicas:       o.Replicas,
		LimitMarkerTTL: markerTTL,
	})
	if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
		if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
			return &driver.UnsupportedError{Backend: "nats", Feature: "a server without per-message TTLs",
				Instead: "the backend needs NATS Server " + minServer + " or later with JetStream: upgrade the server"}
		}
		var ae *jetstream.APIError
		if errors.As(err, &ae) && (ae.ErrorCode == errCodeReplicasNotSupported || ae.ErrorCode == errCodeNoPeers) && o.Replicas > 1 {
			// Nothing was created.
			return &driver.InvalidOptionError{Option: "Replicas", Value: strconv.Itoa(o.Replicas),
				Reason: fmt.Sprintf("the server cannot place %d replicas of the bucket %q (%s): use replicas=1 on a single server, or at most the number of servers in the JetStream cluster", o.Replicas, o.Bucket, ae.Description)}
		}
		return fmt.Errorf("nats: creating the bucket %q: %w", o.Bucket, err)
	}
	si, err := b.streamInfo(ctx)
	if err != nil {
		return err
	}
	b.cfg = si.Config
	if !si.Config.AllowMsgTTL || si.Config.MarkerTTL <= 0 {
		return &driver.InvalidOptionError{Option: "Bucket", Value: fmt.Sprintf("%q", o.Bucket),
			Reason: "the existing bucket was created without per-message TTLs (LimitMarkerTTL), which locks need; use another bucket, or delete this one (nats kv del " + o.Bucket + ") so that the backend creates it"}
	}
	return nil
}

// clock estimates the server's clock from the time stamps of its
// answers (STREAM.INFO's ts), refreshed at most every clockRefresh: what
// Inspect, List and a HeldError's remaining times are judged by. Expiry
// itself is the server's alone (per-message TTLs).
type clock struct {
	mu   sync.Mutex
	skew time.Duration // server minus local
	at   time.Time     // when measured (local); zero: never
	rtt  time.Duration
}

const clockRefresh = 30 * time.Second

func (c *clock) observe(t0, t1, server time.Time) {
	if server.IsZero() {
		return
	}
	rtt := t1.Sub(t0)
	mid := t0.Add(rtt / 2)
	c.mu.Lock()
	defer c.mu.Unlock()
	// A measurement with a shorter round trip is the more precise one.
	if c.at.IsZero() || t1.Sub(c.at) > clockRefresh || rtt <= c.rtt*2 {
		c.skew, c.at, c.rtt = server.Sub(mid.Round(0)), t1, rtt
	}
}

// now returns the server's clock as estimated, measuring it first if
// the estimate is old.
func (b *Backend) now(ctx context.Context) time.Time {
	b.clock.mu.Lock()
	stale := b.clock.at.IsZero() || time.Since(b.clock.at) > clockRefresh
	b.clock.mu.Unlock()
	if stale {
		_, _ = b.streamInfo(ctx)
	}
	b.clock.mu.Lock()
	defer b.clock.mu.Unlock()
	return time.Now().Round(0).Add(b.clock.skew)
}
