// Package testagent is the TestMain of packages whose tests start
// sandboxes: it builds the static guest agent they run.
package testagent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"tine/sandbox/ns"
)

// Main runs ns.Init (the test binary is also a sandbox's init step),
// builds cmd/tine-agent static into a temporary directory, sets *path to
// it, runs the tests and exits with their code.
func Main(m *testing.M, path *string) {
	ns.Init()
	dir, err := os.MkdirTemp("", "tine-test-agent")
	if err != nil {
		fmt.Fprintf(os.Stderr, "build agent: %v\n", err)
		os.Exit(1)
	}
	*path = filepath.Join(dir, "tine-agent")
	cmd := exec.Command("go", "build", "-o", *path, "tine/cmd/tine-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
