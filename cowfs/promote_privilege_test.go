package cowfs

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// promoteFixture imports base from a host project, lets change edit a
// copy of it, imports that as snap, and returns the project directory.
func promoteFixture(t *testing.T, f *FS, files map[string]string, change func(dir string)) (base, snap SnapshotID, project string) {
	t.Helper()
	ctx := context.Background()
	project = t.TempDir()
	writeTree(t, project, files)
	base, err := f.Import(ctx, project, "")
	if err != nil {
		t.Fatal(err)
	}
	next := t.TempDir()
	writeTree(t, next, files)
	change(next)
	if snap, err = f.Import(ctx, next, ""); err != nil {
		t.Fatal(err)
	}
	return base, snap, project
}

func refusedPaths(res *PromoteResult) map[string]string {
	out := map[string]string{}
	for _, r := range res.Refused {
		out[r.Path] = r.Reason
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A setuid copy of id(1) made in the sandbox must not arrive setuid: run
// as nobody, the promoted file must not print euid 0.
func TestPromoteDropsSetuid(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	id, err := os.ReadFile("/usr/bin/id")
	must(t, err)
	base, snap, project := promoteFixture(t, f, map[string]string{"README": "x"}, func(dir string) {
		must(t, os.WriteFile(filepath.Join(dir, "suid"), id, 0o755))
		must(t, unix.Chmod(filepath.Join(dir, "suid"), 0o4755))
		must(t, os.Mkdir(filepath.Join(dir, "sgid-dir"), 0o755))
		must(t, unix.Chmod(filepath.Join(dir, "sgid-dir"), 0o2775))
	})
	for _, opts := range []PromoteOptions{{DryRun: true}, {}} {
		res, err := f.Promote(ctx, base, snap, project, opts)
		must(t, err)
		r := refusedPaths(res)
		if !strings.Contains(r["suid"], "--allow-setid") || !strings.Contains(r["sgid-dir"], "--allow-setid") {
			t.Fatalf("dry run %v: refused %q, want suid and sgid-dir listed", opts.DryRun, res.Refused)
		}
	}
	st, err := os.Stat(filepath.Join(project, "suid"))
	must(t, err)
	if st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || st.Mode().Perm() != 0o755 {
		t.Fatalf("promoted suid has mode %v, want -rwxr-xr-x", st.Mode())
	}
	if st, _ := os.Stat(filepath.Join(project, "sgid-dir")); st.Mode()&os.ModeSetgid != 0 {
		t.Fatalf("promoted sgid-dir has mode %v", st.Mode())
	}
	// Run it as nobody, the way an attacker would.
	must(t, os.Chmod(project, 0o755))
	must(t, os.Chmod(filepath.Dir(project), 0o755))
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", filepath.Join(project, "suid"), "-u").CombinedOutput()
	if err != nil {
		t.Fatalf("run as nobody: %v: %s", err, out)
	}
	if strings.TrimSpace(string(out)) != "65534" {
		t.Fatalf("promoted file run as nobody has euid %s", out)
	}

	// Opted in, the bit arrives.
	_, snap2, project2 := promoteFixture(t, f, map[string]string{"README": "x"}, func(dir string) {
		must(t, os.WriteFile(filepath.Join(dir, "suid"), []byte("#!/bin/sh\n"), 0o755))
		must(t, unix.Chmod(filepath.Join(dir, "suid"), 0o4755))
	})
	base2, err := f.Import(ctx, project2, "")
	must(t, err)
	res, err := f.Promote(ctx, base2, snap2, project2, PromoteOptions{Privileges: HostPrivileges{SetID: true}})
	must(t, err)
	if len(res.Refused) != 0 {
		t.Fatalf("refused %q with --allow-setid", res.Refused)
	}
	if st, _ := os.Stat(filepath.Join(project2, "suid")); st.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("with SetID the file has mode %v", st.Mode())
	}
}

// A device node made in the sandbox is listed as refused and not created,
// unless allowed; then it gets the snapshot's numbers.
func TestPromoteRefusesDevices(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	base, snap, project := promoteFixture(t, f, map[string]string{"README": "x"}, func(dir string) {
		must(t, unix.Mknod(filepath.Join(dir, "disk"), unix.S_IFBLK|0o666, int(unix.Mkdev(254, 0))))
	})
	res, err := f.Promote(ctx, base, snap, project, PromoteOptions{})
	must(t, err)
	if r := refusedPaths(res)["disk"]; !strings.Contains(r, "--allow-devices") {
		t.Fatalf("refused %q, want disk listed", res.Refused)
	}
	if _, err := os.Lstat(filepath.Join(project, "disk")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("device node created without --allow-devices: %v", err)
	}
	res, err = f.Promote(ctx, base, snap, project, PromoteOptions{Privileges: HostPrivileges{Devices: true}})
	must(t, err)
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(project, "disk"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || st.Rdev != unix.Mkdev(254, 0) || st.Mode&0o777 != 0o644 {
		t.Fatalf("allowed device: mode %o rdev %x; want block 254:0 0644 (umask applied)", st.Mode, st.Rdev)
	}
}

// Entries belong to the promoting user unless --keep-owners.
func TestPromoteOwners(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	base, snap, project := promoteFixture(t, f, map[string]string{"README": "x"}, func(dir string) {
		must(t, os.WriteFile(filepath.Join(dir, "theirs"), []byte("x"), 0o644))
		must(t, os.Lchown(filepath.Join(dir, "theirs"), 1234, 4321))
	})
	res, err := f.Promote(ctx, base, snap, project, PromoteOptions{DryRun: true})
	must(t, err)
	if r := refusedPaths(res)["theirs"]; !strings.Contains(r, "1234:4321") || !strings.Contains(r, "--keep-owners") {
		t.Fatalf("refused %q, want theirs listed with its owner", res.Refused)
	}
	must(t, os.Mkdir(filepath.Join(project, "x"), 0o755)) // a second project from the same base
	must(t, os.Remove(filepath.Join(project, "x")))
	other := t.TempDir()
	writeTree(t, other, map[string]string{"README": "x"})
	for i, opts := range []PromoteOptions{{}, {Privileges: HostPrivileges{Owners: true}}} {
		dir := []string{project, other}[i]
		if _, err := f.Promote(ctx, base, snap, dir, opts); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		must(t, unix.Lstat(filepath.Join(dir, "theirs"), &st))
		want := [2]uint32{uint32(os.Geteuid()), uint32(os.Getegid())}
		if opts.Privileges.Owners {
			want = [2]uint32{1234, 4321}
		}
		if [2]uint32{st.Uid, st.Gid} != want {
			t.Fatalf("owners %v: theirs is %d:%d, want %v", opts.Privileges.Owners, st.Uid, st.Gid, want)
		}
	}
}

// Sockets are listed as refused, fifos are created and listed as changes;
// nothing is skipped silently.
func TestPromoteReportsSocketsAndFifos(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	base, snap, project := promoteFixture(t, f, map[string]string{"README": "x"}, func(dir string) {
		must(t, unix.Mkfifo(filepath.Join(dir, "pipe"), 0o644))
		l, err := net.Listen("unix", filepath.Join(dir, "sock"))
		must(t, err)
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close()
	})
	res, err := f.Promote(ctx, base, snap, project, PromoteOptions{})
	must(t, err)
	if r := refusedPaths(res); len(r) != 1 || !strings.Contains(r["sock"], "socket") {
		t.Fatalf("refused %q, want exactly sock", res.Refused)
	}
	if len(res.Changes) != 2 {
		t.Fatalf("changes %+v, want pipe and sock", res.Changes)
	}
	if st, err := os.Lstat(filepath.Join(project, "pipe")); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("pipe on the host: %v %v", st, err)
	}
	if _, err := os.Lstat(filepath.Join(project, "sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sock on the host: %v", err)
	}
}

// A sandbox cannot make the host's entries more open than the umask
// allows, but bits the host entry already had are kept.
func TestPromoteClampsModesByUmask(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	files := map[string]string{"dir/": "", "shared": "v1", "plain": "v1"}
	project := t.TempDir()
	writeTree(t, project, files)
	must(t, os.Chmod(filepath.Join(project, "shared"), 0o664))
	base, err := f.Import(ctx, project, "")
	must(t, err)
	next := t.TempDir()
	writeTree(t, next, files)
	must(t, os.WriteFile(filepath.Join(next, "shared"), []byte("v2"), 0o664))
	must(t, os.Chmod(filepath.Join(next, "shared"), 0o666))
	must(t, os.Chmod(filepath.Join(next, "dir"), 0o777))
	must(t, os.Chmod(filepath.Join(next, "plain"), 0o666))
	must(t, os.Mkdir(filepath.Join(next, "open"), 0o777))
	must(t, os.Chmod(filepath.Join(next, "open"), 0o777))
	must(t, os.Chmod(next, 0o777))
	snap, err := f.Import(ctx, next, "")
	must(t, err)
	umask := uint32(0o022)
	res, err := f.Promote(ctx, base, snap, project, PromoteOptions{Umask: &umask})
	must(t, err)
	want := map[string]os.FileMode{".": 0o755 | os.ModeDir, "dir": 0o755 | os.ModeDir, "open": 0o755 | os.ModeDir, "plain": 0o644, "shared": 0o664}
	must(t, os.Chmod(project, 0o700)) // the test's own dir: back to private before checking others
	want["."] = 0o700 | os.ModeDir
	for p, m := range want {
		st, err := os.Lstat(filepath.Join(project, p))
		must(t, err)
		if st.Mode() != m {
			t.Errorf("%s: mode %v, want %v (changes %v)", p, st.Mode(), m, res.Modes)
		}
	}
}

// The finding: a host entry swapped between the check and the apply for a
// symlink or a hard link to a file outside must not get the sandbox's mode.
func TestPromoteMetadataNeverFollowsSwaps(t *testing.T) {
	ctx := context.Background()
	for _, swap := range []string{"symlink", "hardlink", "dir-symlink"} {
		t.Run(swap, func(t *testing.T) {
			f := openTestFS(t)
			base, snap, project := promoteFixture(t, f, map[string]string{"f": "data", "d/": ""}, func(dir string) {
				must(t, os.Chmod(filepath.Join(dir, "f"), 0o600))
				must(t, os.Chmod(filepath.Join(dir, "d"), 0o700))
			})
			outside := t.TempDir()
			victim := filepath.Join(outside, "victim")
			must(t, os.WriteFile(victim, []byte("data"), 0o644))
			must(t, os.Chmod(outside, 0o755))
			promoteTestHook = func() {
				switch swap {
				case "symlink":
					must(t, os.Remove(filepath.Join(project, "f")))
					must(t, os.Symlink(victim, filepath.Join(project, "f")))
				case "hardlink":
					must(t, os.Remove(filepath.Join(project, "f")))
					must(t, os.Link(victim, filepath.Join(project, "f")))
				case "dir-symlink":
					must(t, os.Remove(filepath.Join(project, "d")))
					must(t, os.Symlink(outside, filepath.Join(project, "d")))
				}
			}
			t.Cleanup(func() { promoteTestHook = nil })
			_, err := f.Promote(ctx, base, snap, project, PromoteOptions{})
			if swap != "hardlink" && err == nil {
				t.Fatal("promotion over a swapped entry succeeded")
			}
			if st, _ := os.Stat(victim); st.Mode().Perm() != 0o644 {
				t.Fatalf("file outside the project got mode %v", st.Mode())
			}
			if st, _ := os.Stat(outside); st.Mode().Perm() != 0o755 {
				t.Fatalf("directory outside the project got mode %v", st.Mode())
			}
			if swap == "hardlink" {
				must(t, err)
				st, err := os.Lstat(filepath.Join(project, "f"))
				must(t, err)
				vst, _ := os.Stat(victim)
				if os.SameFile(st, vst) || st.Mode().Perm() != 0o600 {
					t.Fatalf("hard-linked f was changed in place (mode %v)", st.Mode())
				}
			}
		})
	}
}

// git status in a sandbox rewrites .git/index; it is not promoted unless
// asked for.
func TestPromoteLeavesGitInternals(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	project := t.TempDir()
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "safe.directory=*"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	writeTree(t, project, map[string]string{"main.go": "package main\n", "other.go": "package main\n"})
	git(project, "init", "-q")
	git(project, "add", ".")
	git(project, "commit", "-qm", "init")
	base, err := f.Import(ctx, project, "")
	must(t, err)
	must(t, f.Branch(ctx, base, "agent"))
	mnt := t.TempDir()
	m, err := f.Mount(ctx, "agent", mnt, nil)
	must(t, err)
	t.Cleanup(func() { m.Unmount() })
	must(t, os.WriteFile(filepath.Join(mnt, "main.go"), []byte("package main // edited\n"), 0o644))
	// Same content, new time: git status refreshes the index entry and
	// writes .git/index.
	now := time.Now()
	must(t, os.Chtimes(filepath.Join(mnt, "other.go"), now, now))
	git(mnt, "status")
	snap, err := f.Snapshot(ctx, "agent")
	must(t, err)
	all, err := f.DiffWith(ctx, base, snap, DiffOptions{GitInternals: true})
	must(t, err)
	indexChanged := false
	for _, c := range all {
		indexChanged = indexChanged || c.Path == ".git/index"
	}
	if !indexChanged {
		t.Fatal("git status in the sandbox did not rewrite .git/index; the test proves nothing")
	}
	index, err := os.ReadFile(filepath.Join(project, ".git/index"))
	must(t, err)
	res, err := f.Promote(ctx, base, snap, project, PromoteOptions{})
	must(t, err)
	for _, c := range res.Changes {
		if strings.HasPrefix(c.Path, ".git") {
			t.Errorf("promoted %s", c.Path)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(project, ".git/index")); !bytes.Equal(after, index) {
		t.Fatal(".git/index was promoted")
	}
	if b, _ := os.ReadFile(filepath.Join(project, "main.go")); string(b) != "package main // edited\n" {
		t.Fatalf("main.go = %q", b)
	}
}

// TestPromoteLeavesRepositoryLookalikes: a directory a sandbox lays out as
// a git repository under any name (HEAD, objects/, refs/, and a config
// naming a command for git to run) is not promoted: run in it on the
// host, git would take it for a repository and run the command. A
// directory with only some of those names is promoted as usual.
func TestPromoteLeavesRepositoryLookalikes(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	project := t.TempDir()
	writeTree(t, project, map[string]string{"main.go": "package main\n"})
	base, err := f.Import(ctx, project, "")
	must(t, err)
	mark := filepath.Join(t.TempDir(), "ran")
	must(t, f.Branch(ctx, base, "agent"))
	m, err := f.Mount(ctx, "agent", t.TempDir(), nil)
	must(t, err)
	t.Cleanup(func() { m.Unmount() })
	writeTree(t, m.Dir(), map[string]string{
		"evil/HEAD":          "ref: refs/heads/master\n",
		"evil/objects/":      "",
		"evil/refs/heads/":   "",
		"evil/config":        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = ..\n\tfsmonitor = \"touch " + mark + "; false\"\n",
		"src/evil2/HEAD":     "ref: refs/heads/master\n",
		"src/evil2/objects/": "",
		"src/evil2/refs/":    "",
		"notrepo/HEAD":       "just a file\n",
		"notrepo/refs/":      "",
	})
	snap, err := f.Snapshot(ctx, "agent")
	must(t, err)
	res, err := f.Promote(ctx, base, snap, project, PromoteOptions{})
	must(t, err)
	for _, c := range res.Changes {
		if strings.HasPrefix(c.Path, "evil") || strings.HasPrefix(c.Path, "src/evil2") {
			t.Errorf("promoted %s", c.Path)
		}
	}
	if _, err := os.Stat(filepath.Join(project, "notrepo", "HEAD")); err != nil {
		t.Errorf("a directory that is no repository was not promoted: %v", err)
	}
	if _, err := os.Stat(filepath.Join(project, "evil")); err == nil {
		// Had it come, git status there would run its fsmonitor.
		cmd := exec.Command("git", "status")
		cmd.Dir = filepath.Join(project, "evil")
		cmd.Run()
		_, err := os.Stat(mark)
		t.Fatalf("the lookalike reached the host (its command ran: %v)", err == nil)
	}
}
