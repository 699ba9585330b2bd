package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"tine/cowfs"
)

// crashChildEnv, when set in the environment, makes the test binary the
// promoting process of TestPromoteCrash: it reads the plan from the file
// the variable names, writes the journal and applies it.
const crashChildEnv = "TINE_PROMOTE_CRASH_CHILD"

func init() {
	if p := os.Getenv(crashChildEnv); p != "" {
		os.Exit(crashChild(p))
	}
}

// crashPlan is what the child of TestPromoteCrash applies.
type crashPlan struct {
	Store   string
	Journal string
	J       journal
}

func crashChild(planPath string) int {
	ctx := context.Background()
	var pl crashPlan
	b, err := os.ReadFile(planPath)
	if err == nil {
		err = json.Unmarshal(b, &pl)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	f, err := cowfs.Open(pl.Store, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pl.J.PID = os.Getpid()
	if err := writeJSON(pl.Journal, &pl.J); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ours, _ := f.Resolve(ctx, pl.J.Ours)
	merged, _ := f.Resolve(ctx, pl.J.Merged)
	_, err = f.Promote(ctx, ours, merged, pl.J.Dir, cowfs.PromoteOptions{Umask: pl.J.Umask, Diff: cowfs.DiffOptions{GitInternals: true}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Remove(pl.Journal)
	return 0
}

// TestPromoteCrash kills a promotion (a child process, SIGKILL) at random
// points and checks that resume leaves exactly the merged tree and abort
// exactly the tree before, whichever point it stopped at.
func TestPromoteCrash(t *testing.T) {
	rounds := 13
	if testing.Short() {
		rounds = 5
	}
	ctx := context.Background()
	base := t.TempDir()
	store := filepath.Join(base, "store")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	umask := uint32(0o022)
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	stopped := 0
	midway := 0
	applyMs := 40 // about how long the child's apply takes here
	for round := 0; round < rounds; round++ {
		dir := filepath.Join(base, fmt.Sprintf("host%d", round))
		for i := 0; i < 120; i++ {
			sub := filepath.Join(dir, fmt.Sprintf("d%d", i%6))
			os.MkdirAll(sub, 0o755)
			os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%d", i)), []byte(fmt.Sprintf("old %d\n", i)), 0o644)
		}
		f, err := cowfs.Open(store, nil)
		if err != nil {
			t.Fatal(err)
		}
		ours, err := f.Import(ctx, dir, "")
		if err != nil {
			t.Fatal(err)
		}
		top, _ := f.TopEntry(ctx, ours)
		var edits []cowfs.TreeEdit
		for i := 0; i < 120; i++ {
			p := fmt.Sprintf("d%d/f%d", i%6, i)
			switch i % 4 {
			case 0:
				e, err := f.PutFileData(ctx, []byte(fmt.Sprintf("new %d\n", i)), cowfs.Entry{Mode: 0o644, MtimeNs: time.Now().UnixNano()})
				if err != nil {
					t.Fatal(err)
				}
				edits = append(edits, cowfs.TreeEdit{Path: p, Entry: &e})
			case 1:
				edits = append(edits, cowfs.TreeEdit{Path: p})
			case 2:
				e, _ := f.PutFileData(ctx, []byte("added\n"), cowfs.Entry{Mode: 0o600, MtimeNs: 1})
				edits = append(edits, cowfs.TreeEdit{Path: fmt.Sprintf("new%d/sub/g%d", i%5, i), Entry: &e})
			}
		}
		for i := 0; i < 5; i++ {
			d := cowfs.Entry{Type: cowfs.TypeDir, Mode: 0o755, MtimeNs: top.MtimeNs}
			edits = append(edits, cowfs.TreeEdit{Path: fmt.Sprintf("new%d", i), Entry: &d}, cowfs.TreeEdit{Path: fmt.Sprintf("new%d/sub", i), Entry: &d})
		}
		edits = append(edits, cowfs.TreeEdit{Path: "d5"}) // a whole directory goes
		for i := 5; i < 120; i += 6 {
			edits = append(edits, cowfs.TreeEdit{Path: fmt.Sprintf("d5/f%d", i)})
		}
		merged, err := f.EditSnapshot(ctx, ours, edits)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		jp := filepath.Join(base, fmt.Sprintf("journal%d.json", round))
		pl := crashPlan{Store: store, Journal: jp, J: journal{Dir: dir, Ours: ours.String(), Merged: merged.String(), Umask: &umask}}
		b, _ := json.Marshal(pl)
		planPath := filepath.Join(base, "plan.json")
		os.WriteFile(planPath, b, 0o600)
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), crashChildEnv+"="+planPath)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Most kills fall while the apply runs: after the journal is
		// written, at a random point within the apply's usual time.
		if round%4 != 3 {
			for i := 0; i < 5000; i++ {
				if _, err := os.Stat(jp); err == nil {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		var werr error
		if round == 0 {
			// The first round runs whole, to time the apply.
			t0 := time.Now()
			if werr = cmd.Wait(); werr != nil {
				t.Fatalf("uninterrupted promotion: %v", werr)
			}
			applyMs = max(1, int(time.Since(t0).Milliseconds()))
			t.Logf("the apply took %d ms", applyMs)
		} else {
			time.Sleep(time.Duration(rng.Intn(applyMs)) * time.Millisecond)
			cmd.Process.Signal(syscall.SIGKILL)
			werr = cmd.Wait()
		}
		f, err = cowfs.Open(store, nil)
		if err != nil {
			t.Fatal(err)
		}
		var j journal
		if err := readJSON(jp, &j); err != nil {
			// Killed before the journal, or finished: the tree is one side whole.
			t.Logf("round %d: no journal (%v; child %v)", round, err, werr)
			if !sameTree(t, f, dir, ours) && !sameTree(t, f, dir, merged) {
				t.Fatalf("round %d: without a journal the tree is neither side", round)
			}
			f.Close()
			continue
		}
		stopped++
		if !sameTreeQuiet(f, dir, ours) && !sameTreeQuiet(f, dir, merged) {
			midway++
		}
		abort := round%2 == 1
		if _, err := resumeJournal(ctx, f, &j, abort); err != nil {
			t.Fatalf("round %d (abort %v): %v", round, abort, err)
		}
		want := merged
		if abort {
			want = ours
		}
		if !sameTree(t, f, dir, want) {
			t.Fatalf("round %d (abort %v): the tree is not the expected side", round, abort)
		}
		// A second resume finds nothing left to do.
		if _, err := resumeJournal(ctx, f, &j, abort); err != nil {
			t.Fatalf("round %d: resume again: %v", round, err)
		}
		f.Close()
	}
	t.Logf("%d of %d rounds stopped with a journal, %d of them with the tree halfway", stopped, rounds, midway)
	if stopped == 0 || !testing.Short() && midway == 0 {
		t.Fatal("no round was killed partway; the test checked nothing")
	}
}

// sameTree imports dir and reports whether it equals snapshot want in
// every type, content, mode and owner, and holds no temporary entry.
func sameTree(t *testing.T, f *cowfs.FS, dir string, want cowfs.SnapshotID) bool {
	t.Helper()
	got, err := f.Import(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	d, err := f.Diff(context.Background(), got, want)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range d {
		t.Logf("differs: %s %s", c.Kind, c.Path)
	}
	return len(d) == 0
}

func sameTreeQuiet(f *cowfs.FS, dir string, want cowfs.SnapshotID) bool {
	got, err := f.Import(context.Background(), dir, "")
	if err != nil {
		return false
	}
	d, err := f.Diff(context.Background(), got, want)
	return err == nil && len(d) == 0
}
