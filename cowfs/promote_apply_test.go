package cowfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// sandboxSnap forks a branch from base, mounts it, lets edit change it
// through the mount and returns the snapshot of the result.
func sandboxSnap(t *testing.T, f *FS, base SnapshotID, name string, edit func(mnt string)) SnapshotID {
	t.Helper()
	ctx := context.Background()
	must(t, f.Branch(ctx, base, name))
	mnt := t.TempDir()
	m, err := f.Mount(ctx, name, mnt, nil)
	must(t, err)
	defer m.Unmount()
	edit(mnt)
	snap, err := f.Snapshot(ctx, name)
	must(t, err)
	return snap
}

// New directories are checked like everything else: what the host made
// at their place or inside them is a conflict.
func TestPromoteNewDirectoryConflicts(t *testing.T) {
	ctx := context.Background()
	for name, mutate := range map[string]func(p string) error{
		"new dir made on host":     func(p string) error { return os.MkdirAll(filepath.Join(p, "added/x"), 0o755) },
		"file in new dir on host":  func(p string) error { return os.WriteFile(filepath.Join(p, "added"), nil, 0o644) },
		"symlink at new dir":       func(p string) error { return os.Symlink("/tmp", filepath.Join(p, "added")) },
		"file into type-changed":   func(p string) error { return os.WriteFile(filepath.Join(p, "src/new.go"), nil, 0o644) },
		"dir under new on the way": func(p string) error { return os.MkdirAll(filepath.Join(p, "added/x/y.txt"), 0o755) },
	} {
		t.Run(name, func(t *testing.T) {
			f := openTestFS(t)
			project := t.TempDir()
			writeTree(t, project, promoteBase)
			base, err := f.Import(ctx, project, "")
			must(t, err)
			snap := importTree(t, f, promoteNew)
			must(t, mutate(project))
			before := readTree(t, project)
			res, err := f.Promote(ctx, base, snap, project, PromoteOptions{DryRun: true})
			if !errors.Is(err, ErrConflict) || len(res.Conflicts) == 0 {
				t.Fatalf("dry run: err = %v, want ErrConflict", err)
			}
			if _, err := f.Promote(ctx, base, snap, project, PromoteOptions{}); !errors.Is(err, ErrConflict) {
				t.Fatalf("err = %v, want ErrConflict", err)
			}
			if diff := cmp.Diff(before, readTree(t, project)); diff != "" {
				t.Fatalf("a refused promotion changed the project:\n%s", diff)
			}
		})
	}
}

// A path longer than PATH_MAX under new directories is promoted whole,
// after the deletions it comes with: walked one name at a time, it never
// meets the limit that made the apply fail after the deletions were done.
func TestPromoteLongPaths(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	project := t.TempDir()
	writeTree(t, project, map[string]string{"doomed": "x"})
	base, err := f.Import(ctx, project, "")
	must(t, err)
	// 40 levels of 200-byte names: 8 KiB of path, more than PATH_MAX.
	deep := sandboxSnap(t, f, base, "deep", func(mnt string) {
		must(t, os.Remove(filepath.Join(mnt, "doomed")))
		fd, err := unix.Open(mnt, unix.O_DIRECTORY, 0)
		must(t, err)
		for i := 0; i < 40; i++ {
			name := fmt.Sprintf("%03d%s", i, strings.Repeat("d", 197))
			must(t, unix.Mkdirat(fd, name, 0o755))
			next, err := unix.Openat(fd, name, unix.O_DIRECTORY, 0)
			must(t, err)
			unix.Close(fd)
			fd = next
		}
		wfd, err := unix.Openat(fd, "leaf", unix.O_CREAT|unix.O_WRONLY, 0o644)
		must(t, err)
		unix.Write(wfd, []byte("deep"))
		unix.Close(wfd)
		unix.Close(fd)
	})
	if _, err := f.Promote(ctx, base, deep, project, PromoteOptions{DryRun: true}); err != nil {
		t.Fatal(err)
	}
	res, err := f.Promote(ctx, base, deep, project, PromoteOptions{})
	must(t, err)
	var leaf string
	for _, c := range res.Changes {
		if strings.HasSuffix(c.Path, "/leaf") {
			leaf = c.Path
		}
	}
	if len(leaf) <= unix.PathMax {
		t.Fatalf("leaf %q is not longer than PATH_MAX", leaf)
	}
	if _, err := os.Lstat(filepath.Join(project, "doomed")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("doomed: %v", err)
	}
	pfd, err := unix.Open(project, unix.O_DIRECTORY, 0)
	must(t, err)
	h := &hostDir{fd: pfd, name: project}
	defer unix.Close(h.fd)
	fd, err := h.open(leaf, unix.O_RDONLY, 0)
	must(t, err)
	b := make([]byte, 10)
	n, _ := unix.Read(fd, b)
	unix.Close(fd)
	if string(b[:n]) != "deep" {
		t.Fatalf("deep leaf holds %q", b[:n])
	}
}

// sparseSnap makes a snapshot holding a file of size bytes with a few
// small writes in it and nothing else.
func sparseSnap(t *testing.T, f *FS, size int64) (base, snap SnapshotID, project string, marks map[int64]string) {
	t.Helper()
	project = t.TempDir()
	base, err := f.Import(context.Background(), project, "")
	must(t, err)
	marks = map[int64]string{0: "head", size / 2: "middle", size - 4: "tail"}
	snap = sandboxSnap(t, f, base, "sparse", func(mnt string) {
		w, err := os.Create(filepath.Join(mnt, "sparse"))
		must(t, err)
		must(t, w.Truncate(size))
		for off, s := range marks {
			_, err := w.WriteAt([]byte(s), off)
			must(t, err)
		}
		must(t, w.Close())
	})
	return base, snap, project, marks
}

func checkSparse(t *testing.T, path string, size int64, marks map[int64]string) {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Stat(path, &st))
	if st.Size != size || st.Blocks*512 > 1<<20 {
		t.Fatalf("%s: size %d, %d bytes on disk; want %d bytes, under 1 MiB on disk", path, st.Size, st.Blocks*512, size)
	}
	r, err := os.Open(path)
	must(t, err)
	defer r.Close()
	for off, s := range marks {
		b := make([]byte, len(s))
		_, err := r.ReadAt(b, off)
		must(t, err)
		if string(b) != s {
			t.Fatalf("%s at %d: %q, want %q", path, off, b, s)
		}
	}
}

// Holes stay holes: a 3 GiB file with a few bytes written takes a few
// blocks on the host, not 3 GiB.
func TestPromoteKeepsHoles(t *testing.T) {
	f := openTestFS(t)
	const size = 3 << 30
	base, snap, project, marks := sparseSnap(t, f, size)
	_, err := f.Promote(context.Background(), base, snap, project, PromoteOptions{})
	must(t, err)
	checkSparse(t, filepath.Join(project, "sparse"), size, marks)
}

// promoteChild runs the promotion that a test's parent process described
// in $TINE_PROMOTE_CHILD, and reports whether it did.
func promoteChild(t *testing.T) bool {
	arg := os.Getenv("TINE_PROMOTE_CHILD")
	if arg == "" {
		return false
	}
	var a struct{ Root, Base, Snap, Project string }
	must(t, json.Unmarshal([]byte(arg), &a))
	f, err := Open(a.Root, nil)
	must(t, err)
	defer f.Close()
	ctx := context.Background()
	base, err := f.Resolve(ctx, a.Base)
	must(t, err)
	snap, err := f.Resolve(ctx, a.Snap)
	must(t, err)
	if _, err := f.Promote(ctx, base, snap, a.Project, PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	// VmHWM is this process's own peak: unlike ru_maxrss, which a child
	// inherits from its parent across fork and exec, it starts anew at exec.
	status, err := os.ReadFile("/proc/self/status")
	must(t, err)
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			fmt.Printf("PEAK %s\n", strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(l, "VmHWM:"), "kB")))
		}
	}
	return true
}

// A 1 TiB sparse file is promoted with bounded memory and disk. The
// promotion runs in a child process so that its peak RSS is its own.
func TestPromoteTerabyteSparseFile(t *testing.T) {
	if promoteChild(t) {
		return
	}
	root := t.TempDir()
	f, err := Open(root, nil)
	must(t, err)
	const size = 1 << 40
	base, snap, project, marks := sparseSnap(t, f, size)
	must(t, f.Close())
	arg, _ := json.Marshal(map[string]string{"Root": root, "Base": base.String(), "Snap": snap.String(), "Project": project})
	cmd := exec.Command(os.Args[0], "-test.run=^TestPromoteTerabyteSparseFile$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TINE_PROMOTE_CHILD="+string(arg))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child promote: %v\n%s", err, out)
	}
	var maxRSS int64 // KiB
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "PEAK "); ok {
			maxRSS, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if maxRSS == 0 {
		t.Fatalf("child did not report its peak memory:\n%s", out)
	}
	t.Logf("promoting a 1 TiB sparse file: child peak RSS %d KiB", maxRSS)
	if maxRSS > 200<<10 {
		t.Fatalf("peak RSS %d KiB promoting a sparse file", maxRSS)
	}
	checkSparse(t, filepath.Join(project, "sparse"), size, marks)
}

// A user who is not root promotes into a project where a read-only
// directory is removed (refused before anything is written) and one is
// created with contents (filled, then made read-only).
func TestPromoteReadOnlyDirectoriesAsUser(t *testing.T) {
	if promoteChild(t) {
		return
	}
	ctx := context.Background()
	top := t.TempDir()
	must(t, os.Chmod(top, 0o755))
	must(t, os.Chmod(filepath.Dir(top), 0o755))
	root, project := filepath.Join(top, "root"), filepath.Join(top, "project")
	f, err := Open(root, nil)
	must(t, err)
	writeTree(t, project, map[string]string{"gone-ro/a": "a", "z": "z"})
	must(t, os.Chmod(filepath.Join(project, "gone-ro"), 0o555))
	base, err := f.Import(ctx, project, "")
	must(t, err)
	removes := importTree(t, f, map[string]string{})
	next := t.TempDir()
	writeTree(t, next, map[string]string{"gone-ro/a": "a", "z": "z", "new-ro/inner/b": "b"})
	must(t, os.Chmod(filepath.Join(next, "new-ro/inner"), 0o555))
	must(t, os.Chmod(filepath.Join(next, "new-ro"), 0o555))
	creates, err := f.Import(ctx, next, "")
	must(t, err)
	must(t, f.Close())
	for _, dir := range []string{root, project} {
		must(t, filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err == nil {
				err = os.Lchown(p, 65534, 65534)
			}
			return err
		}))
	}
	// The test binary, where the user can run it.
	bin := filepath.Join(top, "promote.test")
	exe, err := os.ReadFile(os.Args[0])
	must(t, err)
	must(t, os.WriteFile(bin, exe, 0o755))
	run := func(snap SnapshotID) (string, error) {
		arg, _ := json.Marshal(map[string]string{"Root": root, "Base": base.String(), "Snap": snap.String(), "Project": project})
		cmd := exec.Command(bin, "-test.run=^TestPromoteReadOnlyDirectoriesAsUser$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "TINE_PROMOTE_CHILD="+string(arg))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	before := readTree(t, project)
	out, err := run(removes)
	if err == nil || !strings.Contains(out, "cannot be written") || !strings.Contains(out, "gone-ro") {
		t.Fatalf("removing a read-only directory's contents as a user: %v\n%s", err, out)
	}
	if diff := cmp.Diff(before, readTree(t, project)); diff != "" {
		t.Fatalf("a refused promotion changed the project:\n%s", diff)
	}
	if out, err := run(creates); err != nil {
		t.Fatalf("creating a read-only directory with contents as a user: %v\n%s", err, out)
	}
	for p, want := range map[string]os.FileMode{"new-ro": 0o555, "new-ro/inner": 0o555} {
		st, err := os.Stat(filepath.Join(project, p))
		must(t, err)
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v", p, st.Mode())
		}
	}
	if b, _ := os.ReadFile(filepath.Join(project, "new-ro/inner/b")); !bytes.Equal(b, []byte("b")) {
		t.Fatalf("new-ro/inner/b = %q", b)
	}
}
