package cowfs

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var (
	modelSeed  = flag.Uint64("cowfs.seed", 0, "seed of TestModel (0: from $TINE_COWFS_SEED or the clock)")
	modelSteps = flag.Int("cowfs.steps", 0, "operations in TestModel (0: from $TINE_COWFS_STEPS or 2000)")
)

// treeState is what the model test compares: per path, the observable
// state of the entry.
type treeState map[string]string

func snapshotTree(t *testing.T, root string) treeState {
	t.Helper()
	st := treeState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		sys := info.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v", info.Mode())
		switch {
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" size=%d nlink=%d sha=%x", info.Size(), sys.Nlink, sha256.Sum256(data))
		case info.Mode()&fs.ModeSymlink != 0:
			tgt, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + tgt
		case info.IsDir():
			desc += fmt.Sprintf(" nlink=%d", sys.Nlink)
		}
		st[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return st
}

func errnoOf(err error) string {
	if err == nil {
		return "ok"
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e.Error()
	}
	return err.Error()
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	os.RemoveAll(dst)
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v: %s", src, dst, err, out)
	}
}

// TestModel applies the same random operations to a cowfs branch and to a
// plain directory and compares the two trees after every step. Snapshots,
// forks and rollbacks are mirrored by copies of the plain directory.
func TestModel(t *testing.T) { runModel(t, nil) }

// TestModelSmallMemBudget is TestModel with budgets for in-memory file
// bytes so small that files move between memory and overlay files all
// the time, and budgets full.
func TestModelSmallMemBudget(t *testing.T) {
	runModel(t, &Options{MemBytes: 12 << 10, BranchMemBytes: 8 << 10})
}

func runModel(t *testing.T, opts *Options) {
	needFUSE(t)
	seed := *modelSeed
	if seed == 0 {
		seed, _ = strconv.ParseUint(os.Getenv("TINE_COWFS_SEED"), 10, 64)
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	steps := *modelSteps
	if steps == 0 {
		steps, _ = strconv.Atoi(os.Getenv("TINE_COWFS_STEPS"))
	}
	if steps == 0 {
		steps = 2000
	}
	t.Logf("seed %d (rerun with -cowfs.seed=%d or TINE_COWFS_SEED=%d), %d steps", seed, seed, seed, steps)
	defer func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d", seed)
		}
	}()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ctx := context.Background()
	f := openTestFSWith(t, opts)
	work := t.TempDir()
	ref := filepath.Join(work, "ref")
	if err := os.Mkdir(ref, 0o755); err != nil {
		t.Fatal(err)
	}
	writeTree(t, ref, map[string]string{"a": "start", "d/b": "bee", "d/e/": ""})
	snap0, err := f.Import(ctx, ref, "")
	if err != nil {
		t.Fatal(err)
	}
	snaps := map[SnapshotID]string{}
	snapList := []SnapshotID{snap0}
	snaps[snap0] = filepath.Join(work, "snap0")
	copyTree(t, ref, snaps[snap0])

	branchN := 0
	var m *Mount
	mountBranch := func(snap SnapshotID) {
		if m != nil {
			if err := m.Unmount(); err != nil {
				t.Fatal(err)
			}
		}
		branchN++
		name := fmt.Sprintf("b%d", branchN)
		if err := f.Branch(ctx, snap, name); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(work, "mnt"+strconv.Itoa(branchN))
		os.Mkdir(dir, 0o755)
		m, err = f.Mount(ctx, name, dir, nil)
		if err != nil {
			m = nil
			t.Fatal(err)
		}
	}
	mountBranch(snap0)
	defer func() {
		if m != nil {
			m.Unmount()
		}
		if n := f.memInUse(); n != 0 {
			t.Errorf("%d bytes of file data still in memory after the last unmount", n)
		}
	}()

	names := []string{"a", "b", "c", "d", "d/e", "d/f", "d/e/g", "h"}
	pick := func() string { return names[rng.IntN(len(names))] }
	payload := func(n int) []byte {
		b := make([]byte, n)
		v := byte(rng.IntN(256))
		for i := range b {
			if rng.IntN(64) == 0 {
				v = byte(rng.IntN(256))
			}
			b[i] = v
		}
		return b
	}
	type op struct {
		name string
		fn   func(root string) error
	}
	for step := 0; step < steps; step++ {
		var o op
		p, q := pick(), pick()
		switch k := rng.IntN(100); {
		case k < 12:
			data := payload(rng.IntN(4096))
			o = op{"create " + p, func(r string) error { return os.WriteFile(filepath.Join(r, p), data, 0o644) }}
		case k < 32:
			off := int64(rng.IntN(600 << 10))
			data := payload(1 + rng.IntN(100<<10))
			o = op{fmt.Sprintf("write %s @%d+%d", p, off, len(data)), func(r string) error {
				fh, err := os.OpenFile(filepath.Join(r, p), os.O_WRONLY, 0)
				if err != nil {
					return err
				}
				defer fh.Close()
				_, err = fh.WriteAt(data, off)
				return err
			}}
		case k < 38:
			data := payload(1 + rng.IntN(9000))
			o = op{"append " + p, func(r string) error {
				fh, err := os.OpenFile(filepath.Join(r, p), os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					return err
				}
				defer fh.Close()
				_, err = fh.Write(data)
				return err
			}}
		case k < 46:
			n := int64(rng.IntN(700 << 10))
			o = op{fmt.Sprintf("truncate %s %d", p, n), func(r string) error { return os.Truncate(filepath.Join(r, p), n) }}
		case k < 56:
			o = op{"rename " + p + " " + q, func(r string) error { return os.Rename(filepath.Join(r, p), filepath.Join(r, q)) }}
		case k < 61:
			o = op{"link " + p + " " + q, func(r string) error { return os.Link(filepath.Join(r, p), filepath.Join(r, q)) }}
		case k < 68:
			o = op{"unlink " + p, func(r string) error { return syscall.Unlink(filepath.Join(r, p)) }}
		case k < 75:
			o = op{"mkdir " + p, func(r string) error { return os.Mkdir(filepath.Join(r, p), 0o755) }}
		case k < 79:
			o = op{"rmdir " + p, func(r string) error { return syscall.Rmdir(filepath.Join(r, p)) }}
		case k < 84:
			mode := os.FileMode(0o600 + rng.IntN(0o200))
			o = op{fmt.Sprintf("chmod %s %o", p, mode), func(r string) error { return os.Chmod(filepath.Join(r, p), mode) }}
		case k < 88:
			o = op{"symlink " + q + " " + p, func(r string) error { return os.Symlink(q, filepath.Join(r, p)) }}
		case k < 93:
			id, err := f.Snapshot(ctx, m.Branch())
			if err != nil {
				t.Fatalf("step %d: snapshot: %v", step, err)
			}
			if _, ok := snaps[id]; !ok {
				snaps[id] = filepath.Join(work, fmt.Sprintf("snap%d", len(snaps)))
				snapList = append(snapList, id)
				copyTree(t, ref, snaps[id])
			}
			t.Logf("step %d: snapshot %s", step, id.String()[:12])
			continue
		case k < 96:
			id := snapList[rng.IntN(len(snapList))]
			if err := f.Rollback(ctx, m.Branch(), id); err != nil {
				t.Fatalf("step %d: rollback: %v", step, err)
			}
			copyTree(t, snaps[id], ref)
			o = op{"rollback " + id.String()[:12], nil}
		default:
			id := snapList[rng.IntN(len(snapList))]
			mountBranch(id)
			copyTree(t, snaps[id], ref)
			o = op{"fork " + id.String()[:12], nil}
		}
		if o.fn != nil {
			e1 := errnoOf(o.fn(ref))
			e2 := errnoOf(o.fn(m.Dir()))
			if e1 != e2 {
				t.Fatalf("step %d: %s: plain dir says %s, cowfs says %s", step, o.name, e1, e2)
			}
		}
		want, got := snapshotTree(t, ref), snapshotTree(t, m.Dir())
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("step %d: after %s: trees differ (-plain +cowfs):\n%s", step, o.name, d)
		}
	}
}
