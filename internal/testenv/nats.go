package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ---------------------------------------------------------------- NATS

// NATS Server 2.15 with JetStream, embedded in tools/nats-test-server:
// client port on 127.0.0.1, JetStream's file store in NAME/data (a restart
// keeps it). nats fsyncs every JetStream write (-sync-always); nats-stock
// runs with every setting at the server's default (a sync every two
// minutes). nats3 (nats3.go) is a loopback cluster of three.

func (u *unit) buildNATS(ctx context.Context) error {
	if u.e.root == "" {
		return errors.New("the checkout (tools/nats-test-server) was not found")
	}
	bin, err := u.e.goBuild(ctx, filepath.Join(u.e.root, "tools", "nats-test-server"), "nats-test-server")
	if err != nil {
		return err
	}
	return u.save("NATS_BIN", bin)
}

func natsServer(name string, stock bool) *server {
	s := &server{name: name, packages: noPackages}
	s.install = func(ctx context.Context, u *unit) error { return u.buildNATS(ctx) }
	s.init = func(ctx context.Context, u *unit) error {
		if _, err := u.savePort("NATS_PORT"); err != nil {
			return err
		}
		data := filepath.Join(u.dir, "data")
		_ = os.RemoveAll(data)
		return os.MkdirAll(data, 0o755)
	}
	s.start = func(u *unit, _ string) error {
		argv := []string{u.get("NATS_BIN"), "-store-dir", filepath.Join(u.dir, "data"), "-port", u.get("NATS_PORT"), "-name", name}
		if !stock {
			argv = append(argv, "-sync-always")
		}
		return u.spawn("", nil, argv...)
	}
	s.ready = func(ctx context.Context, u *unit) error {
		return natsJetStreamReady(ctx, hostPort(u.port("NATS_PORT")))
	}
	s.url = func(u *unit) string { return fmt.Sprintf("nats://127.0.0.1:%d", u.port("NATS_PORT")) }
	s.version = func(ctx context.Context, u *unit) string { return natsVersion(ctx, hostPort(u.port("NATS_PORT"))) }
	return s
}

// natsInfo connects to addr and reads the INFO line a NATS server sends
// first; the caller closes the returned connection.
func natsInfo(ctx context.Context, addr string) (map[string]any, net.Conn, *bufio.Reader, error) {
	c, err := dial(ctx, addr)
	if err != nil {
		return nil, nil, nil, err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, nil, nil, err
	}
	js, ok := strings.CutPrefix(strings.TrimSpace(line), "INFO ")
	if !ok {
		c.Close()
		return nil, nil, nil, fmt.Errorf("unexpected greeting %q", firstLine(line))
	}
	var info map[string]any
	if err := json.Unmarshal([]byte(js), &info); err != nil {
		c.Close()
		return nil, nil, nil, err
	}
	return info, c, r, nil
}

func natsVersion(ctx context.Context, addr string) string {
	info, c, _, err := natsInfo(ctx, addr)
	if err != nil {
		return "version unknown"
	}
	c.Close()
	return fmt.Sprintf("NATS Server %v (embedded, JetStream)", info["version"])
}

// natsJetStreamReady passes when the server answers a JetStream account
// info request ($JS.API.INFO) without an error: JetStream is enabled and,
// in a cluster, has a meta leader.
func natsJetStreamReady(ctx context.Context, addr string) error {
	info, c, r, err := natsInfo(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if info["jetstream"] != true {
		return errors.New("JetStream is not enabled")
	}
	if _, err := io.WriteString(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true}\r\nSUB _INBOX.testenv 1\r\nPUB $JS.API.INFO _INBOX.testenv 0\r\n\r\n"); err != nil {
		return err
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || f[0] == "PING" || f[0] == "+OK" || f[0] == "INFO":
			if len(f) > 0 && f[0] == "PING" {
				_, _ = io.WriteString(c, "PONG\r\n")
			}
			continue
		case f[0] == "-ERR":
			return errors.New(strings.TrimSpace(line))
		case f[0] == "HMSG":
			return errors.New("JetStream did not answer (no responders)")
		case f[0] == "MSG" && len(f) >= 4:
			n, _ := strconv.Atoi(f[len(f)-1])
			body := make([]byte, n+2)
			if _, err := io.ReadFull(r, body); err != nil {
				return err
			}
			var resp struct {
				Error *struct {
					Description string `json:"description"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body[:n], &resp); err != nil {
				return err
			}
			if resp.Error != nil {
				return errors.New("JetStream: " + resp.Error.Description)
			}
			return nil
		}
	}
}
