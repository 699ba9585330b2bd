package cowfs

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// needFUSE skips the test when the machine cannot mount FUSE filesystems.
func needFUSE(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("/dev/fuse is missing")
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root (euid is not 0)")
	}
}

func openTestFS(t testing.TB) *FS {
	t.Helper()
	return openTestFSWith(t, nil)
}

func openTestFSWith(t testing.TB, opts *Options) *FS {
	t.Helper()
	f, err := Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// writeTree creates files under dir: a map from relative path to content;
// a path ending in "/" is a directory, content "->x" a symlink to x.
func writeTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if p[len(p)-1] == '/' {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if len(c) > 2 && c[:2] == "->" {
			if err := os.Symlink(c[2:], full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// mountNew imports files as a snapshot, forks branch name from it and
// mounts the branch; the mount is undone at cleanup.
func mountNew(t testing.TB, f *FS, name string, files map[string]string) (*Mount, SnapshotID) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	writeTree(t, src, files)
	snap, err := f.Import(ctx, src, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Branch(ctx, snap, name); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	m, err := f.Mount(ctx, name, mnt, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount() })
	return m, snap
}

// mapEnv makes the test binary a mapChild: "FLAGS SIZE OFF HEX".
const mapEnv = "TINE_COWFS_MAP_CHILD"

// mapWrite maps fd (PROT_READ|PROT_WRITE, flags MAP_SHARED or
// MAP_PRIVATE), copies b in at off and, for a shared mapping, syncs it.
// It does so in a child process (this test binary, run again): a page
// fault on a file this process's own FUSE server serves waits for one of
// its goroutines, while a garbage collection that starts meanwhile waits
// for the faulting thread, which the Go runtime cannot stop inside a
// fault; the test binary then hangs past its timeout. A failed call comes
// back as its errno.
func mapWrite(fd, flags, size, off int, b []byte) error {
	dup, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), "mapped")
	defer f.Close()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %d %d %x", mapEnv, flags, size, off, b))
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("map child: %v: %s", err, out)
	}
	var errno int
	var stage string
	if n, _ := fmt.Sscanf(string(out), "errno %d %s", &errno, &stage); n == 2 {
		return fmt.Errorf("%s: %w", stage, syscall.Errno(errno))
	}
	if strings.TrimSpace(string(out)) != "ok" {
		return fmt.Errorf("map child: %q", out)
	}
	return nil
}

// mapChild does mapWrite's work on fd 3 and prints "ok" or "errno N STAGE".
func mapChild(args string) {
	var flags, size, off int
	var hexb string
	if _, err := fmt.Sscanf(args, "%d %d %d %s", &flags, &size, &off, &hexb); err != nil {
		fmt.Println("bad arguments:", err)
		return
	}
	b, _ := hex.DecodeString(hexb)
	fail := func(stage string, err error) {
		if errno, ok := err.(syscall.Errno); ok {
			fmt.Printf("errno %d %s\n", int(errno), stage)
		} else {
			fmt.Println(stage, err)
		}
	}
	mem, err := unix.Mmap(3, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		fail("mmap", err)
		return
	}
	copy(mem[off:], b)
	if flags&unix.MAP_SHARED != 0 {
		if err := unix.Msync(mem, unix.MS_SYNC); err != nil {
			fail("msync", err)
			return
		}
	}
	fmt.Println("ok")
}

// rootWithMain makes a state root whose branch main starts as files,
// imported with label.
func rootWithMain(t *testing.T, files map[string]string, label string) string {
	t.Helper()
	ctx := context.Background()
	root := t.TempDir()
	f, err := Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	writeTree(t, src, files)
	snap, err := f.Import(ctx, src, label)
	if err == nil {
		err = f.Branch(ctx, snap, "main")
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// startChild re-executes the test binary with env added and returns it
// once its first line of output is want.
func startChild(t *testing.T, env, want string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if sc := bufio.NewScanner(out); !sc.Scan() || sc.Text() != want {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q, want %q", sc.Text(), want)
	}
	return cmd
}
