package cowfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// readTree returns path → content ("->target" for symlinks, "/" suffix for
// directories) of everything under dir.
func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case rel == ".":
		case info.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "->" + target
		case info.IsDir():
			out[rel+"/"] = ""
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var promoteBase = map[string]string{
	"README":        "hello\n",
	"src/main.go":   "package main\n",
	"src/old.go":    "package old\n",
	"gone/a":        "a",
	"gone/deep/b":   "b",
	"link":          "->README",
	"becomes-dir":   "file",
	"keep/same.txt": "same",
}

var promoteNew = map[string]string{
	"README":            "hello, world\n",
	"src/main.go":       "package main\n",
	"src/new.go":        "package new\n",
	"link":              "->src/main.go",
	"becomes-dir/inner": "now a dir",
	"keep/same.txt":     "same",
	"added/x/y.txt":     "y",
}

func TestPromoteAppliesEveryChange(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	project := t.TempDir()
	writeTree(t, project, promoteBase)
	base, err := f.Import(ctx, project, "")
	if err != nil {
		t.Fatal(err)
	}
	snap := importTree(t, f, promoteNew)

	res, err := f.Promote(ctx, base, snap, project, PromoteOptions{DryRun: true})
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if res.Applied {
		t.Fatal("dry run applied changes")
	}
	if got := readTree(t, project); !cmp.Equal(got, expand(promoteBase)) {
		t.Fatalf("dry run changed the project:\n%s", cmp.Diff(expand(promoteBase), got))
	}

	res, err = f.Promote(ctx, base, snap, project, PromoteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Applied || len(res.Changes) == 0 {
		t.Fatalf("result %+v", res)
	}
	if diff := cmp.Diff(expand(promoteNew), readTree(t, project)); diff != "" {
		t.Fatalf("project after promote (-want +got):\n%s", diff)
	}
}

// expand adds the directories implied by a writeTree map.
func expand(files map[string]string) map[string]string {
	out := map[string]string{}
	for p, c := range files {
		out[p] = c
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			out[d+"/"] = ""
		}
	}
	return out
}

func TestPromoteRefusesConflicts(t *testing.T) {
	ctx := context.Background()
	cases := map[string]func(project string) error{
		"modified on host": func(p string) error { return os.WriteFile(filepath.Join(p, "README"), []byte("mine\n"), 0o644) },
		"deleted on host":  func(p string) error { return os.Remove(filepath.Join(p, "src/old.go")) },
		"added on host":    func(p string) error { return os.WriteFile(filepath.Join(p, "src/new.go"), []byte("x"), 0o644) },
		"extra file in deleted dir": func(p string) error {
			return os.WriteFile(filepath.Join(p, "gone/deep/notes"), []byte("x"), 0o644)
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			f := openTestFS(t)
			project := t.TempDir()
			writeTree(t, project, promoteBase)
			base, err := f.Import(ctx, project, "")
			if err != nil {
				t.Fatal(err)
			}
			snap := importTree(t, f, promoteNew)
			if err := mutate(project); err != nil {
				t.Fatal(err)
			}
			before := readTree(t, project)
			res, err := f.Promote(ctx, base, snap, project, PromoteOptions{})
			if !errors.Is(err, ErrConflict) {
				t.Fatalf("err = %v, want ErrConflict", err)
			}
			if res == nil || len(res.Conflicts) == 0 || res.Applied {
				t.Fatalf("result %+v", res)
			}
			if diff := cmp.Diff(before, readTree(t, project)); diff != "" {
				t.Fatalf("a refused promotion changed the project:\n%s", diff)
			}
		})
	}
}

// A symlink planted on the host where the base had a directory must not
// let the promotion write outside the project.
func TestPromoteDoesNotFollowHostSymlinks(t *testing.T) {
	ctx := context.Background()
	f := openTestFS(t)
	project := t.TempDir()
	outside := t.TempDir()
	writeTree(t, project, map[string]string{"sub/f": "1"})
	base, err := f.Import(ctx, project, "")
	if err != nil {
		t.Fatal(err)
	}
	snap := importTree(t, f, map[string]string{"sub/f": "1", "sub/evil": "pwned"})
	if err := os.RemoveAll(filepath.Join(project, "sub")); err != nil {
		t.Fatal(err)
	}
	writeTree(t, outside, map[string]string{"f": "1"})
	if err := os.Symlink(outside, filepath.Join(project, "sub")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Promote(ctx, base, snap, project, PromoteOptions{}); err == nil {
		t.Fatal("promotion through a host symlink succeeded")
	}
	if _, err := os.Lstat(filepath.Join(outside, "evil")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("promotion wrote outside the project: %v", err)
	}
}
