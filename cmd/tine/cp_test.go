package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestParseCpEnd(t *testing.T) {
	for in, want := range map[string]cpEnd{
		"sb:/etc/x": {sb: "sb", path: "/etc/x"},
		"sb:rel":    {sb: "sb", path: "rel"},
		"sb:":       {sb: "sb"},
		"./a:b":     {path: "./a:b"},
		"/tmp/a:b":  {path: "/tmp/a:b"},
		":x":        {path: ":x"},
		"-":         {path: "-"},
		"plain.txt": {path: "plain.txt"},
		"sb:/a:b/c": {sb: "sb", path: "/a:b/c"},
	} {
		if got := parseCpEnd(in); got != want {
			t.Errorf("parseCpEnd(%q) = %+v, want %+v", in, got, want)
		}
	}
}

// TestCp copies into and out of a running sandbox through the CLI: a
// file keeps its mode going in, a relative path is in the project, stdin
// and stdout work, and what the host cannot have is refused with the
// host's file left as it was.
func TestCp(t *testing.T) {
	c, base := daemonCLI(t)
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	c.ok("create", proj, "--name", "a")
	script := filepath.Join(base, "run.sh")
	os.WriteFile(script, []byte("#!/bin/sh\necho ran\n"), 0o755)

	c.ok("cp", script, "a:/tmp/")
	if out := c.ok("exec", "a", "--", "/tmp/run.sh"); out != "ran\n" {
		t.Errorf("the copied script: %q", out)
	}
	// An existing directory without the slash: the file goes inside it.
	c.ok("cp", script, "a:/tmp")
	c.ok("cp", "--mode", "0700", script, "a:/tmp/mode.sh")
	if out := c.ok("exec", "a", "--", "stat", "-c", "%a %n", "/tmp/run.sh", "/tmp/mode.sh"); out != "755 /tmp/run.sh\n700 /tmp/mode.sh\n" {
		t.Errorf("modes in the sandbox: %q", out)
	}
	c.ok("cp", script, "a:sub.sh")
	if out := c.ok("exec", "a", "--", "cat", filepath.Join(proj, "sub.sh")); !strings.Contains(out, "echo ran") {
		t.Errorf("relative path not in the project: %q", out)
	}
	if _, errOut, code := c.run("piped\n", "cp", "-", "a:/tmp/in.txt"); code != 0 || !strings.Contains(errOut, "to a:/tmp/in.txt") {
		t.Fatalf("cp - : exit %d, %s", code, errOut)
	}
	if out := c.ok("cp", "a:/tmp/in.txt", "-"); out != "piped\n" {
		t.Errorf("cp to stdout: %q", out)
	}
	outDir := filepath.Join(base, "out")
	os.MkdirAll(outDir, 0o755)
	var res cpResult
	if err := json.Unmarshal([]byte(c.ok("--json", "cp", "a:/tmp/in.txt", outDir)), &res); err != nil {
		t.Fatal(err)
	}
	if res.Tree == nil || res.Tree.Files != 1 || res.Tree.Dirs != 0 {
		t.Errorf("cp --json: tree %+v, want one file", res.Tree)
	}
	res.Tree = nil
	if want := (cpResult{Sandbox: "a", Path: "/tmp/in.txt", Local: filepath.Join(outDir, "in.txt"), Direction: "out", Bytes: 6}); res != want {
		t.Errorf("cp --json: %+v, want %+v", res, want)
	}
	if b, err := os.ReadFile(filepath.Join(outDir, "in.txt")); err != nil || string(b) != "piped\n" {
		t.Errorf("copied out: %q %v", b, err)
	}
	// A directory over a file, a missing file: refused, the host's file
	// untouched.
	keep := filepath.Join(outDir, "keep")
	os.WriteFile(keep, []byte("mine"), 0o644)
	for _, src := range []string{"a:/tmp", "a:/nonexistent"} {
		if _, errOut, code := c.run("", "cp", src, keep); code == 0 || errOut == "" {
			t.Errorf("cp %s: exit %d", src, code)
		}
	}
	if b, _ := os.ReadFile(keep); string(b) != "mine" {
		t.Errorf("a failed copy changed the host's file: %q", b)
	}
	if ents, _ := os.ReadDir(outDir); len(ents) != 2 {
		t.Errorf("a failed copy left files behind: %v", ents)
	}
	for _, args := range [][]string{{"cp", "--mode", "0755", proj, "a:/x"}, {"cp", "x", "y"}, {"cp", "a:/x", "b:/y"}, {"cp", "-", "a:/tmp/"}, {"cp", "a:/tmp", "-"}, {"cp", "a:/tmp/in.txt", filepath.Join(base, "nodir") + "/"}} {
		if _, _, code := c.run("", args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}

// TestCpTree copies directory trees into and out of a sandbox through the
// CLI, as cp -r places them, and checks what a hostile sandbox's tree can
// and cannot make on the host: no setuid bit, no fifo, a symlink kept as
// a link and never written through, a sparse file that takes no room, and
// nothing outside the destination.
func TestCpTree(t *testing.T) {
	c, base := daemonCLI(t)
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	c.ok("create", proj, "--name", "a")
	src := filepath.Join(base, "src")
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha\n"), 0o644)
	os.WriteFile(filepath.Join(src, "bin", "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
	os.Symlink("a.txt", filepath.Join(src, "link"))

	// Into an existing directory: under the source's name.
	c.ok("cp", src, "a:/tmp/")
	if out := c.ok("exec", "a", "--", "sh", "-c", "cat /tmp/src/link; /tmp/src/bin/run.sh; readlink /tmp/src/link"); out != "alpha\nran\na.txt\n" {
		t.Errorf("the tree in the sandbox: %q", out)
	}
	// As a new path, relative to the project.
	var res cpResult
	if err := json.Unmarshal([]byte(c.ok("--json", "cp", src, "a:copy")), &res); err != nil {
		t.Fatal(err)
	}
	if res.Path != filepath.Join(proj, "copy") || res.Direction != "in" || res.Tree == nil || res.Tree.Files != 2 || res.Tree.Dirs != 2 || res.Tree.Symlinks != 1 || res.Bytes != 25 {
		t.Errorf("cp --json of a tree: %+v %+v", res, res.Tree)
	}
	if _, _, code := c.run("", "cp", src, "a:/tmp/nonexistent/"); code == 0 {
		t.Error("a tree into a missing directory (trailing slash) was copied")
	}

	// Out of the sandbox: what the sandbox made, as the host may have it.
	c.ok("exec", "a", "--", "sh", "-c", `set -e; mkdir -p /tmp/out/d; echo hi > /tmp/out/d/f
cp /bin/true /tmp/out/suid; chmod 4755 /tmp/out/suid
ln -s /etc/passwd /tmp/out/pw; mkfifo /tmp/out/fifo; truncate -s 256M /tmp/out/sparse`)
	got := filepath.Join(base, "got")
	_, errOut, code := c.run("", "cp", "a:/tmp/out", got)
	if code != 0 || !strings.Contains(errOut, "left out") {
		t.Fatalf("cp out: exit %d, %s", code, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(got, "d", "f")); err != nil || string(b) != "hi\n" {
		t.Errorf("the tree's file: %q %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(got, "suid")); err != nil || st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || st.Mode().Perm()&0o100 == 0 {
		t.Errorf("a setuid file out of a sandbox: %v %v", st.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(got, "pw")); err != nil || l != "/etc/passwd" {
		t.Errorf("the symlink: %q %v", l, err)
	}
	if _, err := os.Lstat(filepath.Join(got, "fifo")); !os.IsNotExist(err) {
		t.Errorf("a fifo was made on the host: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(got, "sparse"), &st); err != nil || st.Size != 256<<20 || st.Blocks*512 > 1<<20 {
		t.Errorf("a sparse file: size %d, %d bytes of blocks, %v", st.Size, st.Blocks*512, err)
	}

	// Into an existing host directory whose tree holds a symlink where the
	// sandbox's tree has a directory: refused, nothing written through it.
	outside := filepath.Join(base, "outside")
	os.MkdirAll(outside, 0o755)
	trap := filepath.Join(base, "trap")
	os.MkdirAll(filepath.Join(trap, "out"), 0o755)
	os.Symlink(outside, filepath.Join(trap, "out", "d"))
	if _, errOut, code := c.run("", "cp", "a:/tmp/out", trap); code == 0 {
		t.Errorf("a copy through the host's symlink succeeded: %s", errOut)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("the copy wrote through a symlink: %v", ents)
	}
	// A missing source leaves nothing.
	if _, _, code := c.run("", "cp", "a:/tmp/nonexistent", filepath.Join(base, "none")); code == 0 {
		t.Error("a missing source was copied")
	}
	if _, err := os.Lstat(filepath.Join(base, "none")); !os.IsNotExist(err) {
		t.Errorf("a failed copy left its destination: %v", err)
	}
}
