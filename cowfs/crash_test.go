package cowfs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const crashEnv = "TINE_COWFS_CRASH_CHILD" // "root mountpoint" or "kill scenario root work seed"

// TestMain runs the mounting process of TestCrash when started by it, and
// the tests otherwise.
func TestMain(m *testing.M) {
	GuardMain() // StartGuard re-executes this binary
	if v, ok := os.LookupEnv(guardChildEnv); ok {
		guardChild(splitArgs(v))
		os.Exit(1) // guardChild waits until killed
	}
	if v, ok := os.LookupEnv(crashEnv); ok {
		crashChild(splitArgs(v))
		os.Exit(1) // crashChild serves until killed
	}
	if v, ok := os.LookupEnv(mapEnv); ok {
		mapChild(v)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashChild runs a TestCrashKill scenario (args "kill ..."), or mounts
// branch main of the FS at args[0] on args[1] (or, with a third argument
// "pool", from a pool of two at args[1]), prints READY and serves until
// killed.
func crashChild(args []string) {
	if len(args) > 0 && args[0] == "kill" {
		killChild(args[1:])
		return
	}
	if len(args) != 2 && (len(args) != 3 || args[2] != "pool") {
		fmt.Println("ERR want: root mountpoint [pool]")
		return
	}
	ctx := context.Background()
	f, err := Open(args[0], nil)
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	if len(args) == 3 {
		p, err := f.NewMountPool(ctx, args[1], 2, nil)
		if err == nil {
			_, err = p.Mount(ctx, "main")
		}
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
	} else if _, err := f.Mount(ctx, "main", args[1], nil); err != nil {
		fmt.Println("ERR", err)
		return
	}
	fmt.Println("READY")
	select {} // serve until killed
}

// TestCrash SIGKILLs the process serving a mount in the middle of writes,
// then checks that everything fsync'd survives and the store verifies.
func TestCrash(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	root, mnt, cmd := serveInChild(t, map[string]string{"old": "old content"})
	durable := pattern(11, 300<<10)
	if err := os.WriteFile(filepath.Join(mnt, "durable"), durable, 0o644); err != nil {
		t.Fatal(err)
	}
	if fh, err := os.OpenFile(filepath.Join(mnt, "durable"), os.O_RDWR, 0); err != nil {
		t.Fatal(err)
	} else if err := fh.Sync(); err != nil {
		t.Fatal(err)
	} else {
		fh.Close()
	}
	// Append to a stream, fsyncing now and then; the server is killed in
	// the middle of the writes.
	data := pattern(12, 64<<20)
	synced := make(chan int, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		st, err := os.Create(filepath.Join(mnt, "stream"))
		if err != nil {
			t.Error(err)
			return
		}
		defer st.Close()
		off := 0
		for i := 0; off+30000 < len(data); i++ {
			n := 10000 + i%7*3000
			if _, err := st.WriteAt(data[off:off+n], int64(off)); err != nil {
				return // the server died
			}
			off += n
			if i%5 == 4 {
				if err := st.Sync(); err != nil {
					return
				}
				synced <- off
			}
		}
	}()
	last, syncs := -1, 0
	for syncs < 20 {
		select {
		case v := <-synced:
			last, syncs = v, syncs+1
			continue
		case <-done:
		case <-time.After(60 * time.Second):
		}
		break
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	<-done
	for len(synced) > 0 {
		last = <-synced
	}
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Logf("lazy unmount: %v", err)
	}
	if last < 0 {
		t.Fatal("no fsync of the stream completed")
	}
	synced2 := last
	t.Logf("killed the server after %d fsyncs; last fsync'd length %d", syncs, synced2)

	f, err := Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := f.Store().Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("store verify after crash: %v", rep.Damaged)
	}
	mnt2 := t.TempDir()
	m, err := f.Mount(ctx, "main", mnt2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmount()
	got, err := os.ReadFile(filepath.Join(mnt2, "durable"))
	if err != nil || !bytes.Equal(got, durable) {
		t.Errorf("durable: fsync'd file lost or wrong after crash (len %d, err %v)", len(got), err)
	}
	st, err := os.ReadFile(filepath.Join(mnt2, "stream"))
	if err != nil {
		t.Fatal(err)
	}
	if len(st) < synced2 {
		t.Errorf("stream: %d bytes after crash, %d were fsync'd", len(st), synced2)
	} else if !bytes.Equal(st[:synced2], data[:synced2]) {
		t.Errorf("stream: fsync'd bytes differ after crash")
	}
	if old, err := os.ReadFile(filepath.Join(mnt2, "old")); err != nil || string(old) != "old content" {
		t.Errorf("old: %q, %v", old, err)
	}
}

func splitArgs(s string) []string {
	var out []string
	for _, f := range bytes.Fields([]byte(s)) {
		out = append(out, string(f))
	}
	return out
}

// serveInChild makes a root whose branch main starts as files (imported
// as snapshot "base") and serves main at a new directory from a
// re-executed test binary, which the caller kills. The mount is detached
// at cleanup.
func serveInChild(t *testing.T, files map[string]string) (root, mnt string, cmd *exec.Cmd) {
	t.Helper()
	root, mnt = rootWithMain(t, files, "base"), t.TempDir()
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	return root, mnt, startServer(t, root, mnt, false)
}
