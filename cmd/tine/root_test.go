package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTyposCreateNoState: a --root that is missing or is not a state root
// (a project directory, say) is an error that names the path and says how
// to make a root, and leaves nothing behind.
func TestTyposCreateNoState(t *testing.T) {
	project := t.TempDir()
	os.WriteFile(filepath.Join(project, "main.go"), []byte("package main\n"), 0o644)
	missing := filepath.Join(t.TempDir(), "nosuch")
	for _, tc := range []struct {
		dir, want string
	}{
		{project, "is not a tine state root"},
		{missing, "tine init --root " + missing},
	} {
		for _, args := range [][]string{
			{"fs", "ls", "--root", tc.dir},
			{"fs", "import", t.TempDir(), "--root", tc.dir},
			{"fs", "branch", "a", "b", "--root", tc.dir},
		} {
			_, errOut, code := tine(t, args...)
			if code == 0 || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, tc.dir) {
				t.Errorf("%q: exit %d, stderr %q; want an error naming %s and saying %q", args, code, errOut, tc.dir, tc.want)
			}
		}
	}
	ents, _ := os.ReadDir(project)
	if len(ents) != 1 {
		t.Errorf("project directory now holds %d entries, want only main.go", len(ents))
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("missing --root was created (stat: %v)", err)
	}
	t.Setenv("TINE_ROOT", missing)
	if _, _, code := tine(t, "fs", "ls"); code == 0 {
		t.Errorf("fs ls with a missing $TINE_ROOT succeeded")
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("missing $TINE_ROOT was created (stat: %v)", err)
	}
}

func TestInit(t *testing.T) {
	root := filepath.Join(t.TempDir(), "a", "root")
	out, errOut, code := tine(t, "init", "--root", root)
	if code != 0 || !strings.Contains(out, "created state root") {
		t.Fatalf("init: exit %d, out %q, err %q", code, out, errOut)
	}
	if fi, err := os.Stat(root); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("new root: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	out, _, code = tine(t, "init", "--root", root, "--json")
	if code != 0 || !strings.Contains(out, `"created": false`) {
		t.Errorf("second init: exit %d, out %q; want created false", code, out)
	}
	if _, _, code := tine(t, "fs", "ls", "--root", root); code != 0 {
		t.Errorf("fs ls on an initialised root: exit %d", code)
	}
	project := t.TempDir()
	os.WriteFile(filepath.Join(project, "x"), nil, 0o644)
	if _, errOut, code := tine(t, "init", "--root", project); code == 0 || !strings.Contains(errOut, "not empty") {
		t.Errorf("init in a non-empty directory: exit %d, %q", code, errOut)
	}
}

// TestFSVerify: fs verify passes on a healthy root and fails, naming the
// damage, when a pack byte is flipped.
func TestFSVerify(t *testing.T) {
	root, src := newRoot(t), t.TempDir()
	os.WriteFile(filepath.Join(src, "a"), bytes.Repeat([]byte("tine verify\n"), 4096), 0o644)
	if _, errOut, code := tine(t, "fs", "import", src, "--name", "base", "--root", root); code != 0 {
		t.Fatalf("import: %s", errOut)
	}
	out, errOut, code := tine(t, "fs", "verify", "--root", root)
	if code != 0 || !strings.Contains(out, ": 0 problems") || !strings.Contains(out, "1 trees") {
		t.Fatalf("verify of a healthy root: exit %d, out %q, err %q", code, out, errOut)
	}
	packs, _ := filepath.Glob(filepath.Join(root, "store", "packs", "*"))
	if len(packs) == 0 {
		t.Fatal("no pack files")
	}
	b, err := os.ReadFile(packs[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	os.WriteFile(packs[0], b, 0o644)
	out, errOut, code = tine(t, "fs", "verify", "--root", root)
	if code != 1 || !strings.Contains(out, "store: ") || !strings.Contains(errOut, "problems found") {
		t.Fatalf("verify of a damaged root: exit %d, out %q, err %q", code, out, errOut)
	}
}
