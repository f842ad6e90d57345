//go:build race

package safety

const raceEnabled = true
