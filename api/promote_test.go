package api_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
)

// TestPromoteThreeWayAPI: through the API, a clash is answered with both
// sides and nothing written; --partial applies the rest; the host's own
// change in another line of the same file is merged; resume without a
// journal is an error that says so.
func TestPromoteThreeWayAPI(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	os.WriteFile(filepath.Join(e.project, "t.txt"), []byte("a\nb\nc\nd\ne\n"), 0o644)
	os.WriteFile(filepath.Join(e.project, "x.txt"), []byte("x\n"), 0o644)
	e.create("s")
	e.sh("s", "cd "+e.project+" && sed -i s/^e$/E/ t.txt && echo sb > x.txt && echo n > n.txt")
	os.WriteFile(filepath.Join(e.project, "t.txt"), []byte("A\nb\nc\nd\ne\n"), 0o644)
	os.WriteFile(filepath.Join(e.project, "x.txt"), []byte("host\n"), 0o644)

	res, err := e.c.Promote(ctx, "s", api.PromoteRequest{})
	if err != nil || res.Applied || res.Error == nil || res.Error.Code != "conflict" || len(res.Merge) != 1 {
		t.Fatalf("clash: %+v %v", res, err)
	}
	m := res.Merge[0]
	if m.Path != "x.txt" || len(m.Hunks) != 1 || m.Hunks[0].Ours[0] != "host\n" || m.Hunks[0].Theirs[0] != "sb\n" {
		t.Fatalf("conflict %+v", m)
	}
	if _, err := os.Stat(filepath.Join(e.project, "n.txt")); err == nil {
		t.Fatal("written despite a conflict")
	}
	if res, err = e.c.Promote(ctx, "s", api.PromoteRequest{Partial: true}); err != nil || !res.Applied || res.Error != nil {
		t.Fatalf("partial: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "t.txt")); string(b) != "A\nb\nc\nd\nE\n" {
		t.Fatalf("merged t.txt %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "n.txt")); string(b) != "n\n" {
		t.Fatalf("n.txt %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(e.project, "x.txt")); string(b) != "host\n" {
		t.Fatalf("x.txt %q", b)
	}
	// Into another directory.
	other := filepath.Join(t.TempDir(), "copy")
	os.MkdirAll(other, 0o755)
	if res, err := e.c.Promote(ctx, "s", api.PromoteRequest{To: other}); err != nil || res.Applied || res.Error == nil || res.HostChanged == 0 {
		t.Fatalf("promote into a directory that lacks the base: %+v %v", res, err)
	}
	if _, err = e.c.Promote(ctx, "s", api.PromoteRequest{Resume: true}); err == nil || !strings.Contains(err.Error(), "no journal") {
		t.Fatalf("resume: %v", err)
	}
}
