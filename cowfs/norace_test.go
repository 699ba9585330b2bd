//go:build !race

package cowfs

// raceEnabled says the tests run under the race detector.
const raceEnabled = false
