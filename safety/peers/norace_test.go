//go:build !race

package peers_test

const raceEnabled = false
