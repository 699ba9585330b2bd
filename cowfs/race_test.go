//go:build race

package cowfs

// raceEnabled says the tests run under the race detector, whose shadow
// memory grows a process's resident set several times over.
const raceEnabled = true
