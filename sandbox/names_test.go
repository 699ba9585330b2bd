package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/sandbox"
)

// TestNamesCheckedUpFront: a name whose agent socket path would pass the
// kernel's bound under this state root is refused with ErrBadName before
// anything is made (it used to make a sandbox whose every command hung);
// a fork whose names are taken or bad is refused before its snapshot is
// taken, so none is left behind.
func TestNamesCheckedUpFront(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	long := strings.Repeat("n", 63)
	if p := filepath.Join(e.root, "sandboxes", long, "runtime/run/agent.sock"); len(p) <= 107 {
		t.Fatalf("the state root %s is too short for this test: %s fits", e.root, p)
	}
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: long, Dir: e.project}); !errors.Is(err, sandbox.ErrBadName) {
		t.Fatalf("create with a name too long for the root: %v, want ErrBadName", err)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "sandboxes", long)); err == nil {
		t.Fatal("the refused sandbox's directory was made")
	}
	e.create("p", sandbox.Limits{})
	e.create("p-2", sandbox.Limits{})
	for _, o := range []sandbox.ForkOptions{{N: 2, Names: []string{"p-1", "p-2"}}, {N: 1, Names: []string{long}}} {
		_, err := e.m.Fork(ctx, "p", o)
		if !errors.Is(err, sandbox.ErrExists) && !errors.Is(err, sandbox.ErrBadName) {
			t.Fatalf("fork %+v: %v, want ErrExists or ErrBadName", o, err)
		}
		if snaps, err := e.m.Snapshots("p"); err != nil || len(snaps) != 0 {
			t.Fatalf("fork %+v refused, snapshots of p: %d, %v", o, len(snaps), err)
		}
	}
	if _, err := e.m.Get("p-1"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("a refused fork left p-1: %v", err)
	}
}

// TestCreateFromSymlink: a project directory given as a symlink to it is
// the directory it names: the sandbox is made from it and shows it at its
// real path.
func TestCreateFromSymlink(t *testing.T) {
	e := newEnv(t, 0)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(e.project, link); err != nil {
		t.Fatal(err)
	}
	info, err := e.m.Create(context.Background(), sandbox.CreateOptions{Name: "viaLink", Dir: link})
	if err != nil {
		t.Fatalf("create from a symlink to the project: %v", err)
	}
	if info.ProjectPath != e.project {
		t.Errorf("project path %s, want %s", info.ProjectPath, e.project)
	}
	if out := e.mustSh("viaLink", "cat "+e.project+"/src/main.txt"); out != "v1\n" {
		t.Fatalf("the project in the sandbox: %q", out)
	}
}
