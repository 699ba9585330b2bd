package main

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// captureStderr runs fn with os.Stderr sent to a file and returns what
// was written.
func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = f
	fn()
	os.Stderr = old
	f.Close()
	b, _ := os.ReadFile(f.Name())
	return string(b)
}

func TestFSDiffFlagsAndJSON(t *testing.T) {
	root, src := newRoot(t), t.TempDir()
	odd := "caf\xe9\xff"
	write := func(name, content string) {
		os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755)
		if err := os.WriteFile(filepath.Join(src, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(".git/index", "1")
	write("gone"+odd, "g")
	if _, e, code := tine(t, "fs", "import", src, "--name", "base", "--root", root); code != 0 {
		t.Fatal(e)
	}
	write(".git/index", "2")
	write(odd, "x")
	os.Remove(filepath.Join(src, "gone"+odd))
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	write("big", strings.Repeat("b", 5000))
	if _, e, code := tine(t, "fs", "import", src, "--name", "next", "--root", root); code != 0 {
		t.Fatal(e)
	}

	out, _, code := tine(t, "fs", "diff", "base", "next", "--json", "--root", root)
	var changes []struct {
		Path    string
		PathB64 string `json:"path_b64"`
	}
	if err := json.Unmarshal([]byte(out), &changes); err != nil || code != 0 {
		t.Fatalf("diff --json: %v, exit %d\n%s", err, code, out)
	}
	found := false
	for _, c := range changes {
		if strings.HasPrefix(c.Path, ".git") {
			t.Errorf("diff lists %q without --include-git-internals", c.Path)
		}
		raw, _ := base64.StdEncoding.DecodeString(c.PathB64)
		found = found || string(raw) == odd
	}
	if !found {
		t.Errorf("no path_b64 gives back %q: %s", odd, out)
	}
	if out, _, _ := tine(t, "fs", "diff", "base", "next", "--include-git-internals", "--root", root); !strings.Contains(out, "M .git/index") {
		t.Errorf("diff --include-git-internals = %q", out)
	}

	var patchOut string
	var code2 int
	notes := captureStderr(t, func() { patchOut, _, code2 = tine(t, "fs", "patch", "base", "next", "--root", root) })
	if code2 != 0 || !strings.Contains(notes, `"fifo"`) || strings.Contains(patchOut, "fifo") {
		t.Errorf("patch: exit %d, stderr %q, patch %q", code2, notes, patchOut)
	}
	if _, e, code := tine(t, "fs", "patch", "base", "next", "--max-file", "1000", "--root", root); code != 1 || !strings.Contains(e, "big") || !strings.Contains(e, "export-tar") {
		t.Errorf("patch over --max-file: exit %d, %q", code, e)
	}

	tarPath := filepath.Join(t.TempDir(), "x.tar")
	out, e, code := tine(t, "fs", "export-tar", "base", "next", tarPath, "--json", "--root", root)
	var res struct {
		Deleted []struct {
			Path    string
			PathB64 string `json:"path_b64"`
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 {
		t.Fatalf("export-tar --json: %v, exit %d, %s\n%s", err, code, e, out)
	}
	if len(res.Deleted) != 1 {
		t.Fatalf("deleted = %+v", res.Deleted)
	}
	if raw, _ := base64.StdEncoding.DecodeString(res.Deleted[0].PathB64); string(raw) != "gone"+odd {
		t.Errorf("deleted path_b64 gives %q", raw)
	}
}
