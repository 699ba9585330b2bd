package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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
	if want := (cpResult{Sandbox: "a", Path: "/tmp/in.txt", Local: filepath.Join(outDir, "in.txt"), Direction: "out", Bytes: 6}); res != want {
		t.Errorf("cp --json: %+v, want %+v", res, want)
	}
	if b, err := os.ReadFile(filepath.Join(outDir, "in.txt")); err != nil || string(b) != "piped\n" {
		t.Errorf("copied out: %q %v", b, err)
	}
	// A directory, a missing file: refused, the host's file untouched.
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
	for _, args := range [][]string{{"cp", base, "a:/x"}, {"cp", "x", "y"}, {"cp", "a:/x", "b:/y"}, {"cp", "-", "a:/tmp/"}} {
		if _, _, code := c.run("", args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}
