// Package clustertest runs the gocron adapters of kit/gocron in real
// gocron schedulers, in several processes (the test binary re-executed),
// against a real Redis (FENCELOCK_TEST_REDIS). It is a module of its own,
// holding only tests, so that the kit's go.mod requires no store client.
package clustertest
