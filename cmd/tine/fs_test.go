package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func tine(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// newRoot makes a state root with "tine init" and returns its path.
func newRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if _, errOut, code := tine(t, "init", "--root", root); code != 0 {
		t.Fatalf("tine init --root %s: exit %d: %s", root, code, errOut)
	}
	return root
}

func TestFSUsageErrors(t *testing.T) {
	root := newRoot(t)
	for _, args := range [][]string{
		{"fs", "import"},
		{"fs", "branch", "only-one", "--root", root},
		{"fs", "diff", "nosuch", "nosuch2", "--root", root},
		{"fs", "import", "x", "--bogus-flag"},
		{"fs", "quota", "b", "lots", "--root", root},
	} {
		if _, errOut, code := tine(t, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, errOut)
		}
	}
}

func TestFSCommandsWithoutMount(t *testing.T) {
	root := newRoot(t)
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "a"), []byte("one\n"), 0o644)
	out, errOut, code := tine(t, "fs", "import", src, "--name", "base", "--root", root)
	if code != 0 {
		t.Fatalf("import: %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	if len(id) != 64 {
		t.Fatalf("import printed %q, want a snapshot id", out)
	}
	if _, errOut, code := tine(t, "fs", "branch", "base", "main", "--root", root); code != 0 {
		t.Fatalf("branch: %s", errOut)
	}
	if _, errOut, code := tine(t, "fs", "branch", "base", "main", "--root", root); code != 1 || !strings.Contains(errOut, "already exists") {
		t.Errorf("second branch of the same name: exit %d, %q", code, errOut)
	}
	out, errOut, code = tine(t, "fs", "ls", "--json", "--root", root)
	if code != 0 {
		t.Fatalf("ls: %s", errOut)
	}
	var ls struct {
		Branches  []struct{ Name, Head string }
		Snapshots []struct {
			ID    string
			Names []string
		}
	}
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, out)
	}
	if len(ls.Branches) != 1 || ls.Branches[0].Name != "main" || ls.Branches[0].Head != id {
		t.Errorf("ls branches = %+v", ls.Branches)
	}
	if len(ls.Snapshots) != 1 || ls.Snapshots[0].ID != id || len(ls.Snapshots[0].Names) != 1 {
		t.Errorf("ls snapshots = %+v", ls.Snapshots)
	}
	os.WriteFile(filepath.Join(src, "a"), []byte("two\n"), 0o644)
	os.WriteFile(filepath.Join(src, "b"), []byte("bee\n"), 0o644)
	if _, errOut, code := tine(t, "fs", "import", src, "--name", "next", "--root", root); code != 0 {
		t.Fatalf("import: %s", errOut)
	}
	out, _, code = tine(t, "fs", "diff", "base", "next", "--root", root)
	if code != 0 || out != "M a\nA b\n" {
		t.Errorf("diff = %q (exit %d)", out, code)
	}
	out, _, code = tine(t, "fs", "patch", "base", "next", "--root", root)
	if code != 0 || !strings.Contains(out, "-one\n+two\n") {
		t.Errorf("patch = %q (exit %d)", out, code)
	}
	tarPath := filepath.Join(t.TempDir(), "x.tar")
	if _, errOut, code := tine(t, "fs", "export-tar", "next", "base", tarPath, "--root", root); code != 0 {
		t.Fatalf("export-tar: %s", errOut)
	}
	if st, err := os.Stat(tarPath); err != nil || st.Size() == 0 {
		t.Errorf("tar not written: %v", err)
	}
	if _, errOut, code := tine(t, "fs", "rollback", "main", "next", "--root", root); code != 0 {
		t.Fatalf("rollback: %s", errOut)
	}
	out, _, _ = tine(t, "fs", "diff", "main", "next", "--root", root)
	if out != "" {
		t.Errorf("after rollback, main differs from next: %q", out)
	}
}

// TestFSMountThroughDaemon: with a daemon running, fs commands go to it
// (it owns the store), "fs mount" is served by it for as long as the
// command waits, and commands on the mounted branch work meanwhile.
func TestFSMountThroughDaemon(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs /dev/fuse and root")
	}
	root, src, mnt := newRoot(t), t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "a"), []byte("one\n"), 0o644)
	if _, errOut, code := tine(t, "fs", "import", src, "--name", "base", "--root", root); code != 0 {
		t.Fatal(errOut)
	}
	if _, errOut, code := tine(t, "fs", "branch", "base", "main", "--root", root); code != 0 {
		t.Fatal(errOut)
	}
	// Whatever happens, leave no mount behind.
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	stopDaemon := serveInProcess(t, root)
	done := mountInBackground(t, "main", mnt, root)
	if _, err := os.Stat(filepath.Join(mnt, "a")); err != nil {
		t.Fatalf("mounted branch: %v", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "new"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// These go through the daemon: it owns the store.
	out, errOut, code := tine(t, "fs", "diff", "base", "main", "--root", root)
	if code != 0 || out != "A new\n" {
		t.Errorf("diff through the daemon = %q, %q, %d", out, errOut, code)
	}
	out, errOut, code = tine(t, "fs", "snapshot", "main", "--name", "s1", "--root", root)
	if code != 0 || len(strings.TrimSpace(out)) != 64 {
		t.Errorf("snapshot through the daemon = %q, %q", out, errOut)
	}
	if _, errOut, code := tine(t, "fs", "rollback", "main", "base", "--root", root); code != 0 {
		t.Errorf("rollback: %s", errOut)
	}
	if _, err := os.Stat(filepath.Join(mnt, "new")); !os.IsNotExist(err) {
		t.Errorf("after rollback of the mounted branch, new still exists (%v)", err)
	}
	if _, _, code := tine(t, "fs", "diff", "nosuch", "main", "--root", root); code != 2 {
		t.Errorf("bad snapshot through the daemon: exit %d, want 2", code)
	}
	// A second mount is served by the daemon too.
	if _, errOut, code := tine(t, "fs", "branch", "s1", "second", "--root", root); code != 0 {
		t.Fatal(errOut)
	}
	mnt2 := t.TempDir()
	t.Cleanup(func() { unix.Unmount(mnt2, unix.MNT_DETACH) })
	done2 := mountInBackground(t, "second", mnt2, root)
	if _, err := os.Stat(filepath.Join(mnt2, "new")); err != nil {
		t.Fatalf("second mount, without the snapshot's files: %v", err)
	}
	unmount(t, mnt2)
	select {
	case <-done2:
	case <-time.After(20 * time.Second):
		t.Fatal("second mount command did not return after unmount")
	}
	unmount(t, mnt)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("mount command did not return after unmount")
	}
	stopDaemon() // checks that the socket is gone
}

// mountInBackground runs "tine fs mount branch dir", which waits while
// the branch is mounted, and returns once the command said it is mounted:
// the files can show in dir before the daemon has answered, and an
// unmount then would fail the mount. The channel gets the command's exit
// code.
func mountInBackground(t *testing.T, branch, dir, root string) <-chan int {
	t.Helper()
	out := &firstWrite{said: make(chan struct{})}
	done := make(chan int, 1)
	go func() {
		var errOut bytes.Buffer
		code := run([]string{"fs", "mount", branch, dir, "--root", root}, out, &errOut)
		if code != 0 {
			t.Errorf("mount %s: %s", branch, errOut.String())
		}
		done <- code
	}()
	select {
	case <-out.said:
	case code := <-done:
		t.Fatalf("mount %s ended with exit %d before saying it was mounted", branch, code)
	case <-time.After(10 * time.Second):
		t.Fatalf("mount %s: not mounted after 10 s", branch)
	}
	return done
}

// firstWrite is a Writer that closes said at its first write.
type firstWrite struct {
	once sync.Once
	said chan struct{}
}

func (w *firstWrite) Write(b []byte) (int, error) {
	w.once.Do(func() { close(w.said) })
	return len(b), nil
}

// unmount unmounts dir as a user would, retrying while something else on
// the machine briefly holds it busy.
func unmount(t *testing.T, dir string) {
	t.Helper()
	var err error
	for i := 0; i < 50; i++ {
		if err = unix.Unmount(dir, 0); err != unix.EBUSY {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("unmount %s: %v", dir, err)
	}
}
