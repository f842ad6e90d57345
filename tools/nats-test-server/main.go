// Command nats-test-server runs a NATS server with JetStream (embedded from
// github.com/nats-io/nats-server/v2) on loopback for fencelock's tests: a
// single server by default, or one member of a loopback cluster when
// -routes names its peers (scripts/testenv's nats3).
//
// It is started by scripts/testenv; it is not part of the library module.
// JetStream keeps its streams in files under -store-dir, so a restart keeps
// them. It prints "ready" on stdout once the server accepts clients and
// exits cleanly on SIGTERM/SIGINT.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	var (
		storeDir    = flag.String("store-dir", "", "JetStream store directory (required)")
		name        = flag.String("name", "fencelock-test", "server name (unique in a cluster)")
		host        = flag.String("host", "127.0.0.1", "address to listen on")
		port        = flag.Int("port", 0, "client port (required)")
		clusterPort = flag.Int("cluster-port", 0, "cluster (route) port; 0: no cluster")
		routes      = flag.String("routes", "", "nats://host:port,... of every member's cluster port (with -cluster-port)")
		clusterName = flag.String("cluster-name", "fencelock", "cluster name (with -cluster-port)")
		httpPort    = flag.Int("http-port", 0, "monitoring (HTTP) port: /healthz, /jsz; 0: none")
		syncAlways  = flag.Bool("sync-always", false, "fsync every JetStream write (default: the server's sync interval)")
		startWait   = flag.Duration("start-timeout", 60*time.Second, "how long to wait for the server to accept clients")
		debug       = flag.Bool("debug", false, "log the server's debug messages")
	)
	flag.Parse()
	if *storeDir == "" || *port <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	opts := &server.Options{
		ServerName: *name,
		Host:       *host,
		Port:       *port,
		JetStream:  true,
		StoreDir:   *storeDir,
		SyncAlways: *syncAlways,
		NoSigs:     true,
		Debug:      *debug,
	}
	if *httpPort > 0 {
		opts.HTTPHost, opts.HTTPPort = *host, *httpPort
	}
	if *clusterPort > 0 {
		opts.Cluster = server.ClusterOpts{Name: *clusterName, Host: *host, Port: *clusterPort}
		opts.Routes = server.RoutesFromStr(*routes)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		log.Fatalf("nats-test-server: %v", err)
	}
	s.ConfigureLogger()
	go s.Start()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	if !s.ReadyForConnections(*startWait) {
		s.Shutdown()
		log.Fatalf("nats-test-server: not ready after %v", *startWait)
	}
	fmt.Printf("ready nats://%s:%d\n", *host, *port)

	done := make(chan struct{})
	go func() { s.WaitForShutdown(); close(done) }()
	select {
	case sig := <-sigs:
		log.Printf("nats-test-server: %v, stopping", sig)
		s.Shutdown()
		<-done
		log.Printf("nats-test-server: stopped")
	case <-done:
		log.Fatalf("nats-test-server: the server stopped")
	}
}
