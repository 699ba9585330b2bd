package main

import (
	"bytes"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tine/internal/testimage"
)

// rootlessUser is the unprivileged user TestRootlessEndToEnd runs tine as.
const rootlessUser = "tine-rootless-test"

// TestRootlessEndToEnd runs the CLI as a user other than root, with no
// --root (the state root is the user's own), through create, exec,
// fork, diff and info: the daemon it starts runs rootless, the sandboxes'
// writes reach neither the host's project nor the user's home, and forks
// see their parent's files.
func TestRootlessEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("makes a user: needs root")
	}
	u, err := user.Lookup(rootlessUser)
	if err != nil {
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", rootlessUser).CombinedOutput(); err != nil {
			t.Fatalf("useradd: %v\n%s", err, out)
		}
		if u, err = user.Lookup(rootlessUser); err != nil {
			t.Fatal(err)
		}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	// FUSE for this user, as hosts whose /dev/fuse is 0666 give everyone.
	var st syscall.Stat_t
	if err := syscall.Stat("/dev/fuse", &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o006 != 0o006 {
		if out, err := exec.Command("setfacl", "-m", "u:"+rootlessUser+":rw", "/dev/fuse").CombinedOutput(); err != nil {
			t.Fatalf("setfacl (package acl): %v\n%s", err, out)
		}
		t.Cleanup(func() { exec.Command("setfacl", "-x", "u:"+rootlessUser, "/dev/fuse").Run() })
	}
	// The binaries' directory and the home must be reachable by the user.
	os.Chmod(filepath.Dir(tineBin), 0o755)
	home, err := os.MkdirTemp("", "tine-rootless-home")
	if err != nil {
		t.Fatal(err)
	}
	proj := filepath.Join(home, "proj")
	os.Mkdir(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "a.txt"), []byte("hello\n"), 0o644)
	for _, p := range []string{home, proj, filepath.Join(proj, "a.txt")} {
		os.Chown(p, uid, gid)
	}
	os.Chmod(home, 0o755)
	tine := func(args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(tineBin, args...)
		cmd.Dir = proj
		cmd.Env = []string{"HOME=" + home, "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "USER=" + rootlessUser}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			return "", err
		}
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			return out.String(), err
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			return out.String(), <-done
		}
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := tine(args...)
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(home, ".local/share/tine/daemon.log"))
			t.Fatalf("tine %s: %v\n%s\ndaemon.log:\n%s", strings.Join(args, " "), err, out, log)
		}
		return out
	}
	t.Cleanup(func() {
		tine("serve", "--stop")
		os.RemoveAll(home)
	})

	must("create", "--from", proj, "--name", "s1")
	out := must("exec", "--cwd", proj, "s1", "--", "sh", "-c",
		"id -u; cat a.txt; echo new > b.txt; echo x > "+home+"/outside")
	if !strings.Contains(out, "0\nhello\n") {
		t.Errorf("exec in a rootless sandbox: %q", out)
	}
	for _, p := range []string{filepath.Join(proj, "b.txt"), filepath.Join(home, "outside")} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("a rootless sandbox's write reached the host: %s", p)
		}
	}
	var sst syscall.Stat_t
	if err := syscall.Stat(filepath.Join(home, ".local/share/tine/sandboxes/s1"), &sst); err != nil || int(sst.Uid) != uid {
		t.Errorf("the sandbox's state is not the user's (uid %d): %+v %v", uid, sst.Uid, err)
	}

	must("fork", "s1", "-n", "2", "--names", "f1,f2")
	if out := must("exec", "--cwd", proj, "f1", "--", "sh", "-c", "cat b.txt; echo f1 > c.txt"); out != "new\n" {
		t.Errorf("fork f1 does not see its parent's file: %q", out)
	}
	if out, err := tine("exec", "--cwd", proj, "f2", "--", "test", "-e", "c.txt"); err == nil {
		t.Errorf("f2 sees f1's file: %q", out)
	}
	if out := must("diff", "s1"); !strings.Contains(out, "b.txt") {
		t.Errorf("diff s1: %q", out)
	}
	if out := must("diff", "f1"); !strings.Contains(out, "c.txt") {
		t.Errorf("diff f1: %q", out)
	}
	if out := must("info"); !strings.Contains(out, "in use: rootless") {
		t.Errorf("info does not say rootless mode is in use:\n%s", out)
	}

	// An image as the OS, unpacked and run by the user's own daemon.
	tb := filepath.Join(home, "bb.tar")
	testimage.WriteTarball(t, tb, "example.test/bb:1", testimage.BusyboxImage(t))
	os.Chown(tb, uid, gid)
	must("image", "import", tb, "--name", "bb")
	must("create", "--from", proj, "--name", "img", "--image", "bb")
	if out := must("exec", "img", "--", "sh", "-c", "cat /only-in-image; echo x > /etc/motd; cat /etc/motd"); out != "image file\nx\n" {
		t.Errorf("exec over an image in rootless mode: %q", out)
	}
	must("fork", "img", "--names", "img2")
	if out := must("exec", "img2", "--", "cat", "/etc/motd"); out != "x\n" {
		t.Errorf("fork over an image in rootless mode: %q", out)
	}
}
