package cowfs

import (
	"context"
	"sort"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
)

// TestPOSIX runs go-fuse's POSIX conformance suite against a fresh branch
// per case.
func TestPOSIX(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	f := openTestFS(t)
	empty, err := f.Import(ctx, t.TempDir(), "empty")
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(posixtest.All))
	for n := range posixtest.All {
		if n == "FcntlFlockLocksFile" {
			// The case expects a second fd of the same process to conflict
			// with the first one's POSIX lock; POSIX locks are per process,
			// so it fails on every filesystem (go-fuse skips it too).
			continue
		}
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		t.Run(n, func(t *testing.T) {
			br := "posix" + string(rune('a'+i/26)) + string(rune('a'+i%26))
			if err := f.Branch(ctx, empty, br); err != nil {
				t.Fatal(err)
			}
			m, err := f.Mount(ctx, br, t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := m.Unmount(); err != nil {
					t.Errorf("unmount: %v", err)
				}
			}()
			posixtest.All[n](t, m.Dir())
		})
	}
}
