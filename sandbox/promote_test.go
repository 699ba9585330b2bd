package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/cowfs"
	"tine/sandbox"
)

// TestPromoteThreeWay: the host moved since the sandbox was made; the
// changes that do not overlap are applied, a text file changed on both
// sides in different lines is merged, one changed in the same line is a
// conflict listed with both sides, and nothing is written until --partial.
func TestPromoteThreeWay(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	lines := "1\n2\n3\n4\n5\n6\n7\n8\n"
	os.WriteFile(filepath.Join(e.project, "lib.txt"), []byte(lines), 0o644)
	os.WriteFile(filepath.Join(e.project, "clash.txt"), []byte("a\nb\nc\n"), 0o644)
	os.WriteFile(filepath.Join(e.project, "gone.txt"), []byte("bye\n"), 0o644)
	e.create("tw", sandbox.Limits{})
	p := e.project
	e.mustSh("tw", fmt.Sprintf("cd %s && sed -i s/^7$/seven/ lib.txt && echo new > added.txt && rm gone.txt && sed -i s/^b$/sandbox/ clash.txt && mkdir -p d/e && echo deep > d/e/f", p))
	// The host moves on: another line of lib.txt, the same line of clash.txt, a file of its own.
	os.WriteFile(filepath.Join(p, "lib.txt"), []byte(strings.Replace(lines, "2\n", "two\n", 1)), 0o644)
	os.WriteFile(filepath.Join(p, "clash.txt"), []byte("a\nhost\nc\n"), 0o644)
	os.WriteFile(filepath.Join(p, "host.txt"), []byte("mine\n"), 0o644)

	res, err := e.m.Promote(ctx, "tw", sandbox.PromoteOptions{PromoteOptions: cowfs.PromoteOptions{DryRun: true}})
	if !errors.Is(err, cowfs.ErrConflict) || len(res.Merge) != 1 || res.Merge[0].Path != "clash.txt" {
		t.Fatalf("dry run: %v %+v", err, res)
	}
	h := res.Merge[0].Hunks
	if len(h) != 1 || strings.Join(h[0].Ours, "") != "host\n" || strings.Join(h[0].Theirs, "") != "sandbox\n" {
		t.Fatalf("hunks %+v", h)
	}
	if res.HostChanged != 3 {
		t.Fatalf("host changed %d paths, want 3 (%v)", res.HostChanged, res.HostExamples)
	}
	if _, err := os.Stat(filepath.Join(p, "added.txt")); err == nil {
		t.Fatal("written on conflict")
	}
	// Partial: everything else goes in; the clash stays the host's.
	res, err = e.m.Promote(ctx, "tw", sandbox.PromoteOptions{Partial: true})
	if err != nil || !res.Applied {
		t.Fatalf("partial: %v %+v", err, res)
	}
	want := map[string]string{"lib.txt": strings.Replace(strings.Replace(lines, "2\n", "two\n", 1), "7\n", "seven\n", 1),
		"clash.txt": "a\nhost\nc\n", "added.txt": "new\n", "host.txt": "mine\n", "d/e/f": "deep\n"}
	for f, w := range want {
		if b, err := os.ReadFile(filepath.Join(p, f)); err != nil || string(b) != w {
			t.Fatalf("%s: %q %v, want %q", f, b, err, w)
		}
	}
	if _, err := os.Stat(filepath.Join(p, "gone.txt")); !os.IsNotExist(err) {
		t.Fatalf("gone.txt: %v", err)
	}
	if len(res.Merged) != 1 || res.Merged[0] != "lib.txt" {
		t.Fatalf("merged %v", res.Merged)
	}
	// The host takes the sandbox's side of the clash: the next promotion is clean.
	os.WriteFile(filepath.Join(p, "clash.txt"), []byte("a\nsandbox\nc\n"), 0o644)
	if res, err = e.m.Promote(ctx, "tw", sandbox.PromoteOptions{}); err != nil || !res.Applied {
		t.Fatalf("second promote: %v %+v", err, res)
	}
	// A directory the sandbox removes while the host added to it is a conflict.
	e.mustSh("tw", fmt.Sprintf("rm -r %s/d", p))
	os.WriteFile(filepath.Join(p, "d", "e", "host"), []byte("x"), 0o644)
	if res, err = e.m.Promote(ctx, "tw", sandbox.PromoteOptions{}); !errors.Is(err, cowfs.ErrConflict) || len(res.Merge) != 2 || res.Merge[0].Path != "d" || res.Merge[1].Path != "d/e" {
		t.Fatalf("removed dir: %v %+v", err, res)
	}
}

// TestPromoteResumeAbortRefusal: a stale journal blocks a new promotion
// with the way out named; resume and abort without one say so.
func TestPromoteNoJournal(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	e.create("nj", sandbox.Limits{})
	if _, err := e.m.ResumePromote(ctx, "nj"); err == nil || !strings.Contains(err.Error(), "no journal") {
		t.Fatalf("resume: %v", err)
	}
	if _, err := e.m.AbortPromote(ctx, "nj"); err == nil || !strings.Contains(err.Error(), "no journal") {
		t.Fatalf("abort: %v", err)
	}
}

// TestPromoteNonUTF8PathsInJSON: a clash and a refusal on file names that
// are not UTF-8 name those files exactly through JSON (path_b64), so that
// a client can act on them.
func TestPromoteNonUTF8PathsInJSON(t *testing.T) {
	e := newEnv(t, 0)
	p := e.project
	clash, setuid := "c\xffd.txt", "s\xfe"
	os.WriteFile(filepath.Join(p, clash), []byte("a\nb\nc\n"), 0o644)
	e.create("odd", sandbox.Limits{})
	e.mustSh("odd", fmt.Sprintf(`cd %s && echo s > "$(printf 's\376')" && chmod 4755 "$(printf 's\376')" && sed -i s/^b$/sandbox/ "$(printf 'c\377d.txt')"`, p))
	os.WriteFile(filepath.Join(p, clash), []byte("a\nhost\nc\n"), 0o644)
	res, err := e.m.Promote(context.Background(), "odd", sandbox.PromoteOptions{PromoteOptions: cowfs.PromoteOptions{DryRun: true}, Partial: true})
	if err != nil {
		t.Fatalf("dry run: %v %+v", err, res)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Merge   []sandbox.MergeConflict `json:"merge_conflicts"`
		Refused []cowfs.Refusal
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Merge) != 1 || back.Merge[0].Path != clash || len(back.Merge[0].Hunks) != 1 {
		t.Fatalf("merge conflicts from %s", b)
	}
	if len(back.Refused) != 1 || back.Refused[0].Path != setuid {
		t.Fatalf("refusals from %s", b)
	}
}
