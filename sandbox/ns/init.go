package ns

import (
	"os"

	"tine/internal/nsinit"
)

// initEnv marks a process this program started as one of its helpers,
// with the helper's mode as its value. The init step of a sandbox is the
// agent binary's (package nsinit, value nsinit.ModeInit).
const initEnv = nsinit.Env

// DefaultPath is the PATH the agent runs with.
const DefaultPath = nsinit.DefaultPath

// Init runs this program's helper process when it was started as one
// (the spawner, the user namespace holder, the rootless probe), and never
// returns then; otherwise it returns at once. Programs that start
// sandboxes call it first thing in main (tests: in TestMain), because the
// runtime re-executes the program itself (/proc/self/exe) as those
// helpers.
func Init() {
	switch os.Getenv(initEnv) {
	case modeHold:
		runHold()
		os.Exit(0)
	case modeRootlessProbe:
		runRootlessProbe()
		os.Exit(0)
	case modeSpawn:
		runSpawner()
		os.Exit(0)
	}
}
