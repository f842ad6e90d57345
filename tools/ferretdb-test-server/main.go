// Command ferretdb-test-server runs FerretDB v1 (embedded from
// github.com/FerretDB/FerretDB/ferretdb) on loopback, as a MongoDB
// wire-protocol server for fencelock's tests: with its SQLite handler
// (the default, data in -data-dir) or, with -handler=postgresql, its
// PostgreSQL handler on the database of -postgresql-url.
//
// It is started by scripts/testenv; it is not part of the library module.
// It prints "ready" on stdout once the listener accepts connections and exits
// cleanly on SIGTERM/SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	var (
		dataDir   = flag.String("data-dir", "", "directory for the SQLite databases (required for -handler=sqlite)")
		handler   = flag.String("handler", "sqlite", "FerretDB handler: sqlite or postgresql")
		pgURL     = flag.String("postgresql-url", "", "PostgreSQL URL of the database to use (required for -handler=postgresql)")
		host      = flag.String("host", "127.0.0.1", "address to listen on")
		port      = flag.Int("port", 0, "TCP port (required)")
		logLevel  = flag.String("log-level", "warn", "log level: debug, info, warn, error")
		startWait = flag.Duration("start-timeout", 60*time.Second, "how long to wait for the listener")
	)
	flag.Parse()
	if *port <= 0 ||
		(*handler == "sqlite" && *dataDir == "") ||
		(*handler == "postgresql" && *pgURL == "") ||
		(*handler != "sqlite" && *handler != "postgresql") {
		flag.Usage()
		os.Exit(2)
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		log.Fatalf("ferretdb-test-server: bad -log-level: %v", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	addr := net.JoinHostPort(*host, strconv.Itoa(*port))
	cfg := &ferretdb.Config{
		Listener:      ferretdb.ListenerConfig{TCP: addr},
		Logger:        logger,
		Handler:       *handler,
		PostgreSQLURL: *pgURL,
	}
	if *handler == "sqlite" {
		dir, err := filepath.Abs(*dataDir)
		if err != nil {
			log.Fatalf("ferretdb-test-server: %v", err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			log.Fatalf("ferretdb-test-server: %v", err)
		}
		cfg.SQLiteURL = "file:" + dir + "/"
	}
	f, err := ferretdb.New(cfg)
	if err != nil {
		log.Fatalf("ferretdb-test-server: %v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()

	// Run binds the listener asynchronously; report ready once it accepts.
	deadline := time.Now().Add(*startWait)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			fmt.Printf("ready %s\n", f.MongoDBURI())
			break
		}
		select {
		case err := <-done:
			if err == nil {
				err = errors.New("stopped before it was ready")
			}
			log.Fatalf("ferretdb-test-server: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log.Fatalf("ferretdb-test-server: %s not accepting connections after %v", addr, *startWait)
		}
	}

	if err := <-done; err != nil {
		log.Fatalf("ferretdb-test-server: %v", err)
	}
	log.Printf("ferretdb-test-server: stopped")
}
