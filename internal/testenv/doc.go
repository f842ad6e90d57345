// Package testenv runs the real database servers fencelock's tests use,
// on loopback, without docker: it starts each server in its own process
// group with its data in a temporary state dir and free ports, waits until
// it really serves (a protocol-level probe: SELECT 1, PING, srvr, /health,
// hello), and records what the tests need to find it.
//
// It is the in-process form of the test environment: the command
// internal/cmd/testenv (and scripts/testenv, which runs it) prints the
// variables for a shell; the conformance tests of this repository's
// backends call URL and Restart; the safety suite drives crashes, pauses
// and leader elections through an Env. docs/testenv.md describes the
// servers, the variables and the state dir.
//
// Servers (Names): the default set postgres, redis, etcd, zookeeper,
// mongo (FerretDB on SQLite) and mongo-pg (FerretDB on the postgres
// server); the clusters etcd3, zookeeper3 and redisha; and postgres-stock,
// redis-stock and zookeeper-stock in their distributions' default
// configurations. Each exports FENCELOCK_TEST_NAME (EnvVar).
//
// The only shell that remains is scripts/install-servers, which Up runs
// for missing Debian packages; the Go tools in tools/ are built with the
// go command and cached.
//
// Every process testenv touches is one whose PID and start time match a
// pid file of the state dir, with its descendants: never a server it did
// not start. This package is internal to the fencelock repository: a
// third-party backend tests against its own servers with package
// conformance.
package testenv
