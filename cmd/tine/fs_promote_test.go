package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFSPromote(t *testing.T) {
	root, project, next := t.TempDir(), t.TempDir(), t.TempDir()
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

	// The project is no longer the base: promoting again is a conflict.
	out, _, code = tine(t, "fs", "promote", "base", "next", project, "--root", root)
	if code != 1 || !strings.Contains(out, "conflict") {
		t.Errorf("second promote: exit %d, output %q; want exit 1 naming the conflicts", code, out)
	}
}
