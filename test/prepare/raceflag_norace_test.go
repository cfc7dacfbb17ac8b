//go:build !race

package prepare

const raceEnabled = false
