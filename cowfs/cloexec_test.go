package cowfs

import (
	"os/exec"
	"strings"
	"testing"
)

// TestFUSEDeviceNotInherited: after a mount, a program this process
// executes holds no descriptor of /dev/fuse.
func TestFUSEDeviceNotInherited(t *testing.T) {
	f := openTestFS(t)
	mountNew(t, f, "main", map[string]string{"a": "x"})
	out, err := exec.Command("sh", "-c", "for f in /proc/$$/fd/*; do readlink $f; done; true").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if strings.Contains(string(out), "/dev/fuse") {
		t.Errorf("a child holds the FUSE device:\n%s", out)
	}
}
