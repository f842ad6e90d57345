package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ---------------------------------------------------------------- nats3

// nats3: three tools/nats-test-server members (1 2 3), server names
// nats3-1 ..., routes on loopback naming every member's cluster port,
// JetStream's file store in nats3/ID/data at the server's default sync
// interval (as clusters run: a grant is acknowledged once a majority has
// it, and a kill -9 of a member keeps what it wrote), a monitoring port
// each (/healthz, /jsz). NATS's own Raft timings (election
// after 4-9 s without a leader's heartbeat) are fixed by the server.
// URL: nats://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3?replicas=3

// nats3Bucket is the bucket whose stream's leader Leader reports: the
// NATS backend's default bucket, which the URL does not override.
const nats3Bucket = "fencelock"

func nats3Server() *server {
	s := &server{name: "nats3", members: []string{"1", "2", "3"}, packages: noPackages}
	addr := func(u *unit, id string) string { return hostPort(u.port("NATS_PORT_" + id)) }
	mon := func(u *unit, id string) string { return hostPort(u.port("NATS_HTTP_PORT_" + id)) }
	serverName := func(id string) string { return "nats3-" + id }
	s.install = func(ctx context.Context, u *unit) error { return u.buildNATS(ctx) }
	s.init = func(ctx context.Context, u *unit) error {
		var routes []string
		for _, id := range s.members {
			for _, k := range []string{"NATS_PORT_", "NATS_HTTP_PORT_"} {
				if _, err := u.savePort(k + id); err != nil {
					return err
				}
			}
			p, err := u.savePort("NATS_CLUSTER_PORT_" + id)
			if err != nil {
				return err
			}
			routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
			_ = os.RemoveAll(u.mdir(id))
			if err := os.MkdirAll(filepath.Join(u.mdir(id), "data"), 0o755); err != nil {
				return err
			}
		}
		return u.save("NATS_ROUTES", strings.Join(routes, ","))
	}
	s.start = func(u *unit, id string) error {
		// A member's route to itself is recognized and dropped by the server.
		return u.spawn(id, nil, u.get("NATS_BIN"), "-store-dir", filepath.Join(u.mdir(id), "data"),
			"-name", serverName(id), "-port", u.get("NATS_PORT_"+id), "-http-port", u.get("NATS_HTTP_PORT_"+id),
			"-cluster-port", u.get("NATS_CLUSTER_PORT_"+id), "-cluster-name", "fencelock-nats3",
			"-routes", u.get("NATS_ROUTES"))
	}
	// A member serves once its /healthz is ok: it accepts clients, sees
	// the JetStream meta leader, and its replicas of streams are current
	// (a restarted member has caught up).
	s.memberReady = func(ctx context.Context, u *unit, id string) error { return natsHealthz(ctx, mon(u, id)) }
	s.ready = func(ctx context.Context, u *unit) error {
		for _, id := range s.members {
			if err := natsHealthz(ctx, mon(u, id)); err != nil {
				return fmt.Errorf("member %s: %w", id, err)
			}
		}
		if _, err := nats3MetaLeader(ctx, u, s.members, mon, serverName); err != nil {
			return err
		}
		return natsJetStreamReady(ctx, addr(u, "1"))
	}
	s.addr = addr
	s.url = func(u *unit) string { return "nats://" + joinAddrs(u, s.members, addr) + "?replicas=3" }
	// leader: the leader of the bucket's stream (KV_fencelock), which
	// orders every write of a lock record and so decides every grant,
	// renewal and release; the JetStream meta leader only creates streams
	// and places their replicas. Before the bucket exists, the meta
	// leader.
	s.leader = func(ctx context.Context, u *unit) (string, error) {
		name, err := nats3StreamLeader(ctx, u, s.members, addr)
		if errors.Is(err, errNoStream) {
			return nats3MetaLeader(ctx, u, s.members, mon, serverName)
		}
		if err != nil {
			return "", err
		}
		for _, id := range s.members {
			if serverName(id) == name && u.active(id) {
				return id, nil
			}
		}
		return "", ErrNoLeader
	}
	// failover: the stream's leader steps down ($JS.API.STREAM.LEADER.STEPDOWN),
	// and another member is elected while all run.
	s.failover = func(ctx context.Context, u *unit) error {
		old, err := s.leader(ctx, u)
		if err != nil {
			return errors.New("testenv: nats3: no stream leader now, nothing to fail over")
		}
		if _, err := nats3StreamLeader(ctx, u, s.members, addr); err != nil {
			return fmt.Errorf("testenv: nats3: failover moves the leader of stream KV_%s, which does not exist yet (open the backend first): %w", nats3Bucket, err)
		}
		if err := natsAPI(ctx, u, s.members, addr, "$JS.API.STREAM.LEADER.STEPDOWN.KV_"+nats3Bucket, nil); err != nil {
			return fmt.Errorf("testenv: nats3: stream leader stepdown: %w", err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if id, err := s.leader(ctx, u); err == nil && id != old {
				u.e.logf("nats3: stream KV_%s is led by member %s (was %s)", nats3Bucket, id, old)
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * pollInterval):
			}
		}
		return errors.New("testenv: nats3: no new stream leader after 30s")
	}
	s.version = func(ctx context.Context, u *unit) string { return natsVersion(ctx, addr(u, "1")) }
	return s
}

var errNoStream = errors.New("stream not found")

// natsHealthz passes when a server's /healthz (monitoring port mon) is ok.
func natsHealthz(ctx context.Context, mon string) error {
	b, err := httpDo(ctx, http.MethodGet, "http://"+mon+"/healthz", "")
	if err != nil {
		if len(b) > 0 {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(b)))
		}
		return err
	}
	return nil
}

// nats3MetaLeader is the member that names itself JetStream meta leader
// in its /jsz; paused and dead members are not asked.
func nats3MetaLeader(ctx context.Context, u *unit, members []string, mon func(*unit, string) string, name func(string) string) (string, error) {
	for _, id := range members {
		if !u.active(id) {
			continue
		}
		b, err := httpDo(ctx, http.MethodGet, "http://"+mon(u, id)+"/jsz", "")
		if err != nil {
			continue
		}
		var jsz struct {
			Meta *struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		if json.Unmarshal(b, &jsz) == nil && jsz.Meta != nil && jsz.Meta.Leader == name(id) {
			return id, nil
		}
	}
	return "", ErrNoLeader
}

// nats3StreamLeader asks the cluster, through a member that runs, for the
// bucket's stream info: only the stream's leader answers it (or, for a
// stream that does not exist, the meta leader: errNoStream). It returns
// the leader's server name, or ErrNoLeader.
func nats3StreamLeader(ctx context.Context, u *unit, members []string, addr func(*unit, string) string) (string, error) {
	var info struct {
		Cluster *struct {
			Leader string `json:"leader"`
		} `json:"cluster"`
	}
	err := natsAPI(ctx, u, members, addr, "$JS.API.STREAM.INFO.KV_"+nats3Bucket, &info)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", ErrNoLeader
	}
	return info.Cluster.Leader, nil
}

// natsAPI sends a JetStream API request (no payload) through the first
// member that runs and answers, and decodes its answer into out (if not
// nil). An answer with error code 10059 (stream not found) is
// errNoStream; no answer, or another error, is ErrNoLeader.
func natsAPI(ctx context.Context, u *unit, members []string, addr func(*unit, string) string, subject string, out any) error {
	for _, id := range members {
		if !u.active(id) {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		body, err := natsRequest(rctx, addr(u, id), subject)
		cancel()
		if err != nil {
			continue
		}
		var resp struct {
			Error *struct {
				ErrCode     int    `json:"err_code"`
				Description string `json:"description"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &resp); err != nil {
			return err
		}
		if resp.Error != nil {
			if resp.Error.ErrCode == 10059 {
				return errNoStream
			}
			return fmt.Errorf("%w (%s)", ErrNoLeader, resp.Error.Description)
		}
		if out != nil {
			return json.Unmarshal(body, out)
		}
		return nil
	}
	return ErrNoLeader
}

// natsRequest publishes an empty request on subject through the server
// at addr and returns the first answer's payload; "no responders" and the
// probe's deadline are errors.
func natsRequest(ctx context.Context, addr, subject string) ([]byte, error) {
	_, c, r, err := natsInfo(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true}\r\nSUB _INBOX.testenv 1\r\nPUB "+subject+" _INBOX.testenv 0\r\n\r\n"); err != nil {
		return nil, err
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || f[0] == "+OK" || f[0] == "INFO":
			continue
		case f[0] == "PING":
			_, _ = io.WriteString(c, "PONG\r\n")
		case f[0] == "-ERR":
			return nil, errors.New(strings.TrimSpace(line))
		case f[0] == "HMSG":
			return nil, errors.New("no responders")
		case f[0] == "MSG" && len(f) >= 4:
			n, err := strconv.Atoi(f[len(f)-1])
			if err != nil {
				return nil, fmt.Errorf("bad MSG line %q", strings.TrimSpace(line))
			}
			body := make([]byte, n+2)
			if _, err := io.ReadFull(r, body); err != nil {
				return nil, err
			}
			return body[:n], nil
		}
	}
}
