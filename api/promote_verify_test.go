package api_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
)

// TestPromoteVerifyAPI: through the API a failing check answers
// verify_failed with its command, exit code and output and writes
// nothing; the check runs on the host as it is now; a passing one
// promotes, its record named in the answer.
func TestPromoteVerifyAPI(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	p := e.project
	os.WriteFile(filepath.Join(p, "t.txt"), []byte("a\n"), 0o644)
	e.create("s")
	e.sh("s", "cd "+p+" && echo sandbox > new.txt")
	// Only the host has host.txt: the check sees it.
	os.WriteFile(filepath.Join(p, "host.txt"), []byte("bad\n"), 0o644)
	check := "cat host.txt new.txt; grep -qx good host.txt"
	res, err := e.c.Promote(ctx, "s", api.PromoteRequest{Verify: check, VerifyTimeoutS: 60})
	if err != nil || res.Applied || res.Error == nil || res.Error.Code != "verify_failed" || res.Verify == nil ||
		res.Verify.ExitCode != 1 || res.Verify.Output != "bad\nsandbox\n" || res.Record == "" {
		t.Fatalf("failing check: %v %+v %+v", err, res, res.Verify)
	}
	if _, err := os.Stat(filepath.Join(p, "new.txt")); err == nil {
		t.Fatal("written despite the failed check")
	}
	os.WriteFile(filepath.Join(p, "host.txt"), []byte("good\n"), 0o644)
	res, err = e.c.Promote(ctx, "s", api.PromoteRequest{Verify: check})
	if err != nil || !res.Applied || res.Error != nil || !res.Verify.Passed || res.Verify.Output != "good\nsandbox\n" {
		t.Fatalf("passing check: %v %+v %+v", err, res, res.Verify)
	}
	if b, _ := os.ReadFile(filepath.Join(p, "new.txt")); string(b) != "sandbox\n" {
		t.Fatalf("new.txt %q", b)
	}
	if _, err := e.c.Promote(ctx, "s", api.PromoteRequest{Verify: check, Resume: true}); err == nil || !strings.Contains(err.Error(), "verify") {
		t.Fatalf("verify with resume: %v", err)
	}
}
