package cowfs

import (
	"context"
	"fmt"
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
	i := 0
	for _, noPT := range []bool{false, true} {
		for _, n := range names {
			i++
			name := n
			if noPT {
				name += "/no-passthrough"
			}
			t.Run(name, func(t *testing.T) {
				br := fmt.Sprintf("posix%d", i)
				if err := f.Branch(ctx, empty, br); err != nil {
					t.Fatal(err)
				}
				m, err := f.Mount(ctx, br, t.TempDir(), &MountOptions{NoPassthrough: noPT})
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
}
