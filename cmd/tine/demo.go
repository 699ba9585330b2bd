package main

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"tine/cowfs"
)

// demoProject is a small Go module with a failing test: the project the
// demo's agents work on.
//
//go:embed demoproject
var demoProject embed.FS

// demoIdea is one agent's attempt at fixing the project: files to write
// (content "" deletes the file).
type demoIdea struct {
	name  string
	files map[string]string
}

var demoIdeas = []demoIdea{
	{"round half up", map[string]string{
		"mean.go": "package mean\n\n// Mean returns the average of xs, or 0 for none.\nfunc Mean(xs []int) int {\n\tif len(xs) == 0 {\n\t\treturn 0\n\t}\n\tsum := 0\n\tfor _, x := range xs {\n\t\tsum += x\n\t}\n\treturn (sum + len(xs)/2) / len(xs)\n}\n",
	}},
	{"guard empty input", map[string]string{
		"mean.go":  "package mean\n\n// Mean returns the average of xs, or 0 for none.\nfunc Mean(xs []int) int {\n\tif len(xs) == 0 {\n\t\treturn 0\n\t}\n\tsum := 0\n\tfor _, x := range xs {\n\t\tsum += x\n\t}\n\treturn sum / len(xs)\n}\n",
		"NOTES.md": "Tried: guard against empty input.\n",
	}},
	{"delete the test", map[string]string{
		"mean_test.go": "",
	}},
}

// demoCommand is "tine demo": the README's main job on embedded defaults.
func (a *app) demoCommand() *cobra.Command {
	var keep bool
	var dir string
	c := &cobra.Command{
		Use:   "demo",
		Short: "sandboxes created, forked, diffed and promoted, on embedded defaults",
		Args:  nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			return runDemo(c.Context(), keep, dir, a.stdout)
		},
	}
	c.Flags().BoolVar(&keep, "keep", false, "keep the demo's directory afterwards")
	c.Flags().StringVar(&dir, "dir", "", "work in this directory (default: a new temporary one)")
	return c
}

func runDemo(ctx context.Context, keepDir bool, workDir string, stdout io.Writer) error {
	keep, dir := &keepDir, &workDir
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the demo's agents run `go test`: %w", err)
	}
	work := *dir
	if work == "" {
		if work, err = os.MkdirTemp("", "tine-demo-"); err != nil {
			return err
		}
	}
	if !*keep {
		defer os.RemoveAll(work)
	}
	d := &demo{out: stdout, work: work, goTool: goTool}
	return d.run(ctx)
}

type demo struct {
	out    io.Writer
	work   string
	goTool string
	fs     *cowfs.FS
}

func (d *demo) say(format string, a ...any) { fmt.Fprintf(d.out, format+"\n", a...) }

func ms(t time.Duration) string { return fmt.Sprintf("%.2f ms", float64(t.Microseconds())/1000) }

func (d *demo) run(ctx context.Context) error {
	project := filepath.Join(d.work, "project")
	if err := writeDemoProject(project); err != nil {
		return err
	}
	d.say("tine demo in %s", d.work)
	d.say("\n1. The project: a Go module whose test fails.")
	if ok, out := d.goTest(ctx, project); ok {
		return errors.New("the demo project's test passes before any fix")
	} else {
		d.say("   go test: FAIL  %s", firstLine(out))
	}

	var err error
	if d.fs, err = cowfs.Open(filepath.Join(d.work, "state"), nil); err != nil {
		return err
	}
	defer d.fs.Close()
	t0 := time.Now()
	base, err := d.fs.Import(ctx, project, "base")
	if err != nil {
		return err
	}
	d.say("\n2. Imported as snapshot %s in %s.", short(base), ms(time.Since(t0)))

	// Mounts are made ahead of time, so that a fork pays for one ref
	// update and not for a FUSE mount.
	pool, err := d.fs.NewMountPool(ctx, filepath.Join(d.work, "sandboxes"), len(demoIdeas), nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	d.say("\n3. %d sandboxes forked from it, each mounted at its own directory:", len(demoIdeas))
	mounts := make([]*cowfs.Mount, len(demoIdeas))
	defer func() {
		for _, m := range mounts {
			if m != nil {
				m.Unmount()
			}
		}
	}()
	for i := range demoIdeas {
		name := fmt.Sprintf("sandbox-%d", i+1)
		t0 := time.Now()
		if mounts[i], err = pool.Fork(ctx, base, name); err != nil {
			return err
		}
		d.say("   %s  forked and mounted in %s -> %s", name, ms(time.Since(t0)), mounts[i].Dir())
	}

	d.say("\n4. Each agent tries its own idea, in parallel, and runs the tests:")
	results := make([]bool, len(demoIdeas))
	outputs := make([]string, len(demoIdeas))
	var wg sync.WaitGroup
	errs := make([]error, len(demoIdeas))
	for i, idea := range demoIdeas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = applyIdea(mounts[i].Dir(), idea); errs[i] == nil {
				results[i], outputs[i] = d.goTest(ctx, mounts[i].Dir())
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	winner := -1
	for i, idea := range demoIdeas {
		verdict := "FAIL"
		if results[i] {
			verdict = "ok"
		}
		d.say("   %s  %-18s go test: %-4s %s", mounts[i].Branch(), idea.name, verdict, firstLine(outputs[i]))
	}
	// A sandbox that deleted the test passes trivially; prefer one that
	// kept every file.
	for i, idea := range demoIdeas {
		if results[i] && !deletes(idea) && winner < 0 {
			winner = i
		}
	}
	if winner < 0 {
		return errors.New("no sandbox fixed the project")
	}

	d.say("\n5. Snapshots and diffs against the base, per sandbox:")
	snaps := make([]cowfs.SnapshotID, len(mounts))
	for i, m := range mounts {
		t0 := time.Now()
		if snaps[i], err = d.fs.Snapshot(ctx, m.Branch()); err != nil {
			return err
		}
		took := time.Since(t0)
		t0 = time.Now()
		changes, err := d.fs.Diff(ctx, base, snaps[i])
		if err != nil {
			return err
		}
		d.say("   %s  snapshot %s in %s, diff in %s:", m.Branch(), short(snaps[i]), ms(took), ms(time.Since(t0)))
		for _, c := range changes {
			if c.Path != "" {
				d.say("      %-9s %s", c.Kind, c.Path)
			}
		}
	}
	var patch bytes.Buffer
	if _, err := d.fs.WritePatch(ctx, &patch, base, snaps[winner], cowfs.PatchOptions{}); err != nil {
		return err
	}
	d.say("\n   The winner, %s (%s), as a patch:", mounts[winner].Branch(), demoIdeas[winner].name)
	for _, l := range strings.Split(strings.TrimRight(patch.String(), "\n"), "\n") {
		d.say("      %s", l)
	}

	loser := len(mounts) - 1
	t0 = time.Now()
	if err := d.fs.Rollback(ctx, mounts[loser].Branch(), base); err != nil {
		return err
	}
	_, statErr := os.Stat(filepath.Join(mounts[loser].Dir(), "mean_test.go"))
	d.say("\n6. %s rolled back to the base in %s: mean_test.go is back: %v.", mounts[loser].Branch(), ms(time.Since(t0)), statErr == nil)

	res, err := d.fs.Promote(ctx, base, snaps[winner], project, cowfs.PromoteOptions{DryRun: true})
	if err != nil {
		return err
	}
	d.say("\n7. Promote %s into the project. Every change first (nothing is written yet):", mounts[winner].Branch())
	for _, c := range res.Changes {
		if c.Path != "" {
			d.say("      %-9s %s", c.Kind, c.Path)
		}
	}
	if _, err := d.fs.Promote(ctx, base, snaps[winner], project, cowfs.PromoteOptions{}); err != nil {
		return err
	}
	ok, out := d.goTest(ctx, project)
	verdict := "FAIL"
	if ok {
		verdict = "ok"
	}
	d.say("   applied; go test in the project: %s %s", verdict, firstLine(out))
	if !ok {
		return errors.New("the promoted fix does not pass in the project")
	}

	// A second promotion from another sandbox now conflicts: the project
	// is no longer the base it forked from.
	other := (winner + 1) % len(mounts)
	if _, err := d.fs.Promote(ctx, base, snaps[other], project, cowfs.PromoteOptions{DryRun: true}); errors.Is(err, cowfs.ErrConflict) {
		d.say("\n8. Promoting %s as well is refused: %v", mounts[other].Branch(), err)
	} else {
		return fmt.Errorf("a second promotion over a changed project was not refused (err: %v)", err)
	}
	d.say("\ndone.")
	return nil
}

func (d *demo) goTest(ctx context.Context, dir string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.goTool, "test", "-count=1", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	return err == nil, string(out)
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "---") && !strings.HasPrefix(l, "===") {
			return "(" + l + ")"
		}
	}
	return ""
}

func short(id cowfs.SnapshotID) string { return id.String()[:12] }

func deletes(idea demoIdea) bool {
	for _, c := range idea.files {
		if c == "" {
			return true
		}
	}
	return false
}

func applyIdea(dir string, idea demoIdea) error {
	for name, content := range idea.files {
		p := filepath.Join(dir, name)
		if content == "" {
			if err := os.Remove(p); err != nil {
				return err
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func writeDemoProject(dst string) error {
	return fs.WalkDir(demoProject, "demoproject", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, "demoproject"), "/")
		target := filepath.Join(dst, rel)
		if e.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := demoProject.ReadFile(p)
		if err != nil {
			return err
		}
		// Embedded files cannot be named go.mod; the project's is stored as go.mod.txt.
		target = strings.TrimSuffix(target, ".txt")
		return os.WriteFile(target, b, 0o644)
	})
}
