package cowfs

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// deepChain is depth directories named name holding leaf file "f" with
// data, as a tree for putTree.
func deepChain(name string, depth int, data string) []tn {
	n := tn{name: "f", data: data}
	for i := 0; i < depth; i++ {
		n = tn{name: name, e: Entry{Type: TypeDir, Mode: 0o755}, kids: []tn{n}}
	}
	return []tn{n}
}

// TestPromoteDeeperThanPathMax: a tree whose paths are longer than
// PATH_MAX promotes whole (every name is resolved beneath the project,
// in steps the kernel takes).
func TestPromoteDeeperThanPathMax(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	project := t.TempDir()
	base, err := f.Import(ctx, project, "")
	if err != nil {
		t.Fatal(err)
	}
	const depth = 2100 // "dd/" x 2100 = 6,300 bytes
	snap := putTree(t, f, deepChain("dd", depth, "deep\n"))
	res, err := f.Promote(ctx, base, snap, project, PromoteOptions{})
	if err != nil || !res.Applied || len(res.Changes) != depth+1 {
		t.Fatalf("promote: %v, applied %v, %d changes", err, res.Applied, len(res.Changes))
	}
	out, err := exec.Command("find", project, "-name", "f", "-type", "f").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := project + "/" + strings.Repeat("dd/", depth) + "f\n"; string(out) != want {
		t.Fatalf("find: %.200q..., want the one file %d levels deep", out, depth)
	}
}

// TestHostDirOpenDirDeep: openDir reaches a directory far past one
// resolution step's worth of names, and refuses a path that passes a
// symlink in any step, or names "..", ".", or nothing.
func TestHostDirOpenDirDeep(t *testing.T) {
	project, outside := t.TempDir(), t.TempDir()
	const depth, link = 1500, 1200 // 4,500 bytes; the symlink is in the second step
	mkChain := func(top string, depth int) {
		fd, err := unix.Open(top, unix.O_DIRECTORY|unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < depth; i++ {
			if err := unix.Mkdirat(fd, "dd", 0o755); err != nil {
				t.Fatal(err)
			}
			next, err := unix.Openat(fd, "dd", unix.O_DIRECTORY|unix.O_RDONLY, 0)
			unix.Close(fd)
			if err != nil {
				t.Fatal(err)
			}
			fd = next
		}
		unix.Close(fd)
	}
	mkChain(project, depth)
	mkChain(outside, depth)
	pfd, err := unix.Open(project, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pfd)
	h := &hostDir{fd: pfd, name: project}
	chain := func(n int) string { return strings.TrimSuffix(strings.Repeat("dd/", n), "/") }
	fd, err := h.openDir(chain(depth))
	if err != nil {
		t.Fatalf("open %d levels deep: %v", depth, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Fatalf("deepest directory: %v %o", err, st.Mode)
	}
	unix.Close(fd)
	for _, bad := range []string{chain(3) + "/../dd", "dd//dd", "./dd", chain(depth) + "/", "dd/.", ".."} {
		if fd, err := h.openDir(bad); err == nil {
			unix.Close(fd)
			t.Errorf("openDir(%.30q...) succeeded", bad)
		}
	}
	// Replace the directory at depth link with a symlink to the same
	// chain outside.
	parent, err := h.openDir(chain(link - 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Renameat(parent, "dd", parent, "moved"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Symlinkat(outside+"/"+chain(link), parent, "dd"); err != nil {
		t.Fatal(err)
	}
	unix.Close(parent)
	fd, err = h.openDir(chain(depth))
	if err == nil {
		unix.Close(fd)
		t.Fatal("openDir followed a symlink deep in the path")
	}
	if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.EXDEV) {
		t.Errorf("error %v, want ELOOP", err)
	}
}
