package vm

import (
	"strings"
	"testing"

	"tine/sandbox"
)

// TestShareSpec: every machine gets the share device; only a sandbox with
// a project has it served and mounted, and a project path the agent
// would refuse is refused at Start, naming it.
func TestShareSpec(t *testing.T) {
	var in Instance
	if err := in.addShare(sandbox.Spec{}, nil); err != nil || in.share == nil || in.share.Connect != nil || in.mount != nil {
		t.Fatalf("no project: %v %+v %+v", err, in.share, in.mount)
	}
	in = Instance{}
	dir := t.TempDir()
	if err := in.addShare(sandbox.Spec{ProjectPath: "/home/me/proj", ProjectSource: dir}, nil); err != nil || in.share.Connect == nil ||
		in.mount == nil || in.mount.Path != "/home/me/proj" || in.mount.Tag != ShareTag || in.share.Tag != ShareTag {
		t.Fatalf("project: %v %+v %+v", err, in.share, in.mount)
	}
	in = Instance{}
	if err := in.addShare(sandbox.Spec{ProjectPath: "/proc/self", ProjectSource: dir}, nil); err == nil || !strings.Contains(err.Error(), "/proc/self") {
		t.Fatalf("a project path under /proc: %v", err)
	}
}
