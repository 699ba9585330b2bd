package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFSPromote(t *testing.T) {
	root, project, next := newRoot(t), t.TempDir(), t.TempDir()
	write := func(dir, name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(project, "a.txt", "one\n")
	write(project, "gone.txt", "bye\n")
	write(next, "a.txt", "two\n")
	write(next, "new.txt", "hi\n")
	for _, args := range [][]string{
		{"fs", "import", project, "--name", "base", "--root", root},
		{"fs", "import", next, "--name", "next", "--root", root},
	} {
		if _, errOut, code := tine(t, args...); code != 0 {
			t.Fatalf("%v: %s", args, errOut)
		}
	}

	out, errOut, code := tine(t, "fs", "promote", "base", "next", project, "--dry-run", "--json", "--root", root)
	if code != 0 {
		t.Fatalf("dry run: exit %d: %s", code, errOut)
	}
	var res struct {
		Changes []changeJSON `json:"changes"`
		Applied bool         `json:"applied"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("dry run output %q: %v", out, err)
	}
	kinds := map[string]string{}
	for _, c := range res.Changes {
		kinds[c.Path] = c.Kind
	}
	if res.Applied || kinds["a.txt"] != "modified" || kinds["gone.txt"] != "deleted" || kinds["new.txt"] != "added" {
		t.Fatalf("dry run result %+v", res)
	}
	if b, _ := os.ReadFile(filepath.Join(project, "a.txt")); string(b) != "one\n" {
		t.Fatalf("dry run wrote a.txt: %q", b)
	}

	if out, errOut, code = tine(t, "fs", "promote", "base", "next", project, "--root", root); code != 0 {
		t.Fatalf("promote: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "applied") {
		t.Errorf("promote output %q", out)
	}
	if b, _ := os.ReadFile(filepath.Join(project, "a.txt")); string(b) != "two\n" {
		t.Errorf("a.txt = %q after promote", b)
	}
	if _, err := os.Stat(filepath.Join(project, "gone.txt")); !os.IsNotExist(err) {
		t.Errorf("gone.txt still there: %v", err)
	}

	// Plain text names each change's mode; a socket and a setuid file are
	// refused and counted, never silently skipped.
	third := t.TempDir()
	write(third, "a.txt", "two\n")
	write(third, "new.txt", "hi\n")
	write(third, "tool", "#!/bin/sh\n")
	if err := unix.Chmod(filepath.Join(third, "tool"), 0o4755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(third, "a.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(third, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, errOut, code := tine(t, "fs", "import", third, "--name", "third", "--root", root); code != 0 {
		t.Fatal(errOut)
	}
	out, errOut, code = tine(t, "fs", "promote", "next", "third", project, "--dry-run", "--root", root)
	for _, want := range []string{"P 0644->0600 a.txt\n", "A 0755 tool\n", "A 0755 sock (socket)\n", `refused "sock"`, `refused "tool"`, "--allow-setid", "1 changes to apply, 2 refused"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("dry run: exit %d, output %q, want %q (%s)", code, out, want, errOut)
		}
	}
	out, _, code = tine(t, "fs", "promote", "next", "third", project, "--allow-setid", "--json", "--root", root)
	var jres struct {
		Changes []struct {
			Path     string `json:"path"`
			HostMode string `json:"host_mode"`
		} `json:"changes"`
		Refused      []refusalJSON `json:"refused"`
		Applied      bool          `json:"applied"`
		AppliedCount int           `json:"applied_count"`
	}
	if err := json.Unmarshal([]byte(out), &jres); err != nil || code != 0 {
		t.Fatalf("promote --json: exit %d, %v: %s", code, err, out)
	}
	if !jres.Applied || jres.AppliedCount != 2 || len(jres.Refused) != 1 || jres.Refused[0].Path != "sock" {
		t.Fatalf("promote --json: %+v", jres)
	}
	if st, err := os.Stat(filepath.Join(project, "tool")); err != nil || st.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("tool with --allow-setid: %v %v", st, err)
	}

	// The project is no longer the base: promoting again is a conflict.
	out, _, code = tine(t, "fs", "promote", "base", "next", project, "--root", root)
	if code != 1 || !strings.Contains(out, "conflict") {
		t.Errorf("second promote: exit %d, output %q; want exit 1 naming the conflicts", code, out)
	}
}
