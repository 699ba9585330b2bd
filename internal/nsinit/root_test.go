package nsinit

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

func openRoot(t *testing.T, dir string) Root {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return Root{FD: fd}
}

// TestRootOpen: paths resolve beneath the root without following any
// symlink, a sandbox's or the host's; missing parts are made only when
// asked.
func TestRootOpen(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	r := openRoot(t, dir)
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "f"), filepath.Join(dir, "flink")); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"link", "link/sub", "flink"} {
		if fd, err := r.Open(rel, true, rel == "flink"); err == nil {
			unix.Close(fd)
			t.Errorf("Open(%q) followed a symlink", rel)
		} else if !errors.Is(err, ErrSymlink) && !errors.Is(err, unix.ELOOP) {
			t.Errorf("Open(%q): %v, want a refused symlink", rel, err)
		}
	}
	for _, rel := range []string{"..", "a/../..", "./x"} {
		if fd, err := r.Open(rel, true, false); err == nil {
			unix.Close(fd)
			t.Errorf("Open(%q) was allowed", rel)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("Open made %d entries outside the root", len(ents))
	}
	if _, err := r.Open("a/b", false, false); !errors.Is(err, unix.ENOENT) {
		t.Errorf("Open of a missing path without mkdir: %v, want ENOENT", err)
	}
	fd, err := r.Open("a/b/file", true, true)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if st, err := os.Lstat(filepath.Join(dir, "a/b/file")); err != nil || !st.Mode().IsRegular() {
		t.Errorf("Open with mkdir and file: %v, %v", st, err)
	}
}

// TestTakeFDs: the descriptors of a user namespace's start are taken in
// initFDs's order, and a wrong count is refused and closed.
func TestTakeFDs(t *testing.T) {
	pipe := func() []int {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		return p[:]
	}
	fds := append(pipe(), pipe()...)
	c := Config{}
	if err := c.takeFDs(fds); err != nil {
		t.Fatal(err)
	}
	if c.overlayFD != fds[0] || c.runFD != fds[1] || c.agentFD != fds[2] || c.projectFD != fds[3] || c.mountFD != -1 {
		t.Errorf("took %+v from %v", c, fds)
	}
	CloseAll(fds)
	fds = pipe()
	w := Config{Warm: true}
	if err := w.takeFDs(fds); err == nil {
		t.Error("a warm start took 2 descriptors, want 3")
	}
	if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("a refused descriptor was left open: %v", err)
	}
	a := Config{API: true}
	rest, err := a.takeAPIFD([]int{7, 8})
	if err != nil || a.apiFD != 8 || len(rest) != 1 {
		t.Errorf("takeAPIFD: %v %d %v", rest, a.apiFD, err)
	}
	if _, err := (&Config{API: true}).takeAPIFD(nil); err == nil {
		t.Error("an API config without its descriptor was taken")
	}
}

// TestFilter: the seccomp program has its layout's length, within a
// jump's reach.
func TestFilter(t *testing.T) {
	if !FilterSupported() {
		t.Skipf("no seccomp filter for %s: the filter is written for amd64 only", runtime.GOARCH)
	}
	p, err := filter()
	if err != nil {
		t.Fatal(err)
	}
	if want := 4 + len(denied) + 3 + 6; len(p) != want {
		t.Errorf("%d instructions, want %d", len(p), want)
	}
}
