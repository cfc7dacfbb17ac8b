//go:build !race

package preparetest

const raceEnabled = false
