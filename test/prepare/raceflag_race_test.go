//go:build race

package prepare

// raceEnabled: the crash test, whose children are other processes, runs
// without the race detector.
const raceEnabled = true
