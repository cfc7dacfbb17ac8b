//go:build race

package preparetest

// raceEnabled: the race detector makes every crash-test child process
// several times slower.
const raceEnabled = true
