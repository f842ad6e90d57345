// Command etcd-test-server runs an etcd server (embedded from
// go.etcd.io/etcd/server/v3/embed) on loopback for fencelock's tests: a
// single-member cluster by default, or one member of a loopback cluster
// when -initial-cluster names its peers (scripts/testenv's etcd3).
//
// It is started by scripts/testenv; it is not part of the library module.
// It prints "ready" on stdout once the server serves clients and exits
// cleanly on SIGTERM/SIGINT.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	var (
		dataDir    = flag.String("data-dir", "", "etcd data directory (required)")
		name       = flag.String("name", "fencelock-test", "member name")
		host       = flag.String("host", "127.0.0.1", "address to listen on")
		clientPort = flag.Int("client-port", 0, "client port (required)")
		peerPort   = flag.Int("peer-port", 0, "peer port (required)")
		logLevel   = flag.String("log-level", "warn", "log level: debug, info, warn, error")
		startWait  = flag.Duration("start-timeout", 60*time.Second, "how long to wait for the server to become ready (0: no limit)")
		initial    = flag.String("initial-cluster", "", "NAME=PEER_URL,... of every member when bootstrapping a cluster (default: this member alone); ignored once the data dir exists")
		token      = flag.String("initial-cluster-token", "fencelock-test", "cluster token used when bootstrapping")
		tickMs     = flag.Uint("heartbeat-interval", 100, "raft heartbeat interval in milliseconds")
		electionMs = flag.Uint("election-timeout", 1000, "raft election timeout in milliseconds")
	)
	flag.Parse()
	if *dataDir == "" || *clientPort <= 0 || *peerPort <= 0 {
		flag.Usage()
		os.Exit(2)
	}

	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", *host, *clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", *host, *peerPort)}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if *initial != "" {
		cfg.InitialCluster = *initial
	}
	cfg.InitialClusterToken = *token
	cfg.TickMs = *tickMs
	cfg.ElectionMs = *electionMs
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.ListenMetricsUrls = nil
	cfg.Logger = "zap"
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd-test-server: start: %v", err)
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	// A cluster member restarted while its peers are down waits for a
	// quorum as long as it takes: -start-timeout 0.
	var startTimeout <-chan time.Time
	if *startWait > 0 {
		startTimeout = time.After(*startWait)
	}

	select {
	case <-e.Server.ReadyNotify():
		fmt.Printf("ready %s\n", clientURL.String())
	case err := <-e.Err():
		log.Fatalf("etcd-test-server: %v", err)
	case s := <-sigs:
		log.Printf("etcd-test-server: %v before ready, stopping", s)
		e.Close()
		os.Exit(1)
	case <-startTimeout:
		e.Server.Stop()
		log.Fatalf("etcd-test-server: not ready after %v", *startWait)
	}

	select {
	case s := <-sigs:
		log.Printf("etcd-test-server: %v, stopping", s)
		closeBounded(e, max(2*time.Second, 2*time.Duration(*electionMs)*time.Millisecond))
		log.Printf("etcd-test-server: stopped")
	case err := <-e.Err():
		e.Close()
		log.Fatalf("etcd-test-server: %v", err)
	}
}

// closeBounded closes e within about limit. A graceful close waits up to
// etcd's request timeout (7 s) twice: for open client streams (watches, lease
// keep-alives) to end, and, on a leader, for the leadership hand-over to a
// peer, which cannot finish when the peers are stopping too (scripts/testenv
// stopping a whole cluster). After limit the raft server is stopped hard (its
// WAL is synced on every write, so nothing acknowledged is lost) and the
// process exits.
func closeBounded(e *embed.Etcd, limit time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Close()
	}()
	select {
	case <-done:
	case <-time.After(limit):
		log.Printf("etcd-test-server: graceful stop takes longer than %v, stopping hard", limit)
		e.Server.HardStop()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}
}
