// Command etcd-test-server runs a single-member etcd server (embedded from
// go.etcd.io/etcd/server/v3/embed) on loopback for fencelock's tests.
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
		startWait  = flag.Duration("start-timeout", 60*time.Second, "how long to wait for the server to become ready")
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

	select {
	case <-e.Server.ReadyNotify():
		fmt.Printf("ready %s\n", clientURL.String())
	case err := <-e.Err():
		log.Fatalf("etcd-test-server: %v", err)
	case s := <-sigs:
		log.Printf("etcd-test-server: %v before ready, stopping", s)
		e.Close()
		os.Exit(1)
	case <-time.After(*startWait):
		e.Server.Stop()
		log.Fatalf("etcd-test-server: not ready after %v", *startWait)
	}

	select {
	case s := <-sigs:
		log.Printf("etcd-test-server: %v, stopping", s)
		e.Close()
		log.Printf("etcd-test-server: stopped")
	case err := <-e.Err():
		e.Close()
		log.Fatalf("etcd-test-server: %v", err)
	}
}
