package cowfs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestExtendAfterPassthroughRead reads an unchanged file through the
// passthrough cache, then extends it with a write past its end, leaving a
// hole: reads must see the old bytes, zeros, then the written bytes.
func TestExtendAfterPassthroughRead(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	const n = 40
	files := map[string]string{}
	head := strings.Repeat("x", 3875)
	for i := range n {
		files[fmt.Sprintf("f%d", i)] = head
	}
	m, _ := mountNew(t, f, "b", files)
	data := bytes.Repeat([]byte{'w'}, 1031)
	const off = 178831
	want := make([]byte, off+len(data))
	copy(want, head)
	copy(want[off:], data)
	for i := range n {
		p := filepath.Join(m.Dir(), fmt.Sprintf("f%d", i))
		for range 3 {
			if got, err := os.ReadFile(p); err != nil || string(got) != head {
				t.Fatalf("%s before the write: %v, %d bytes", p, err, len(got))
			}
		}
		fh, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fh.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
		fh.Close()
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			for j := range min(len(got), len(want)) {
				if got[j] != want[j] {
					t.Fatalf("%s: %d bytes (want %d), first difference at %d: %q, want %q", p, len(got), len(want), j, got[j:min(j+16, len(got))], want[j:min(j+16, len(want))])
				}
			}
			t.Fatalf("%s: %d bytes, want %d", p, len(got), len(want))
		}
	}
}

// TestOnlyReadOnlyOpensGetABacking: an unchanged file's read-only open
// is served from a backing file, and a writable open never is (ADR 0052),
// though the file's registration outlives the read-only handle (ADR 0188).
func TestOnlyReadOnlyOpensGetABacking(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "b", map[string]string{"f": string(pattern(1, passthroughMin)), "small": "old"})
	var out fuse.EntryOut
	c, errno := m.b.rootNode.Lookup(context.Background(), "f", &out)
	if errno != 0 {
		t.Fatalf("lookup f: %v", errno)
	}
	n := c.Operations().(*node)
	for _, o := range []struct {
		flags   uint32
		backing bool
	}{{syscall.O_RDONLY, true}, {syscall.O_WRONLY, false}, {syscall.O_RDWR, false}, {syscall.O_RDONLY, true}} {
		cancel := make(chan struct{})
		ctx := &fuse.Context{Cancel: cancel}
		fh, _, errno := n.Open(ctx, o.flags)
		if errno != 0 {
			t.Fatalf("open f (flags %#x): %v", o.flags, errno)
		}
		if _, got := m.b.backings.take(cancel); got != o.backing {
			t.Errorf("open f (flags %#x): backing file %v, want %v", o.flags, got, o.backing)
		}
		fh.(gofs.FileReleaser).Release(ctx)
	}
	// A file under passthroughMin is read through the server (ADR 0202):
	// no backing file, and no cache file written for it.
	c, errno = m.b.rootNode.Lookup(context.Background(), "small", &out)
	if errno != 0 {
		t.Fatalf("lookup small: %v", errno)
	}
	cancel := make(chan struct{})
	ctx := &fuse.Context{Cancel: cancel}
	fh, _, errno := c.Operations().(*node).Open(ctx, syscall.O_RDONLY)
	if errno != 0 {
		t.Fatalf("open small: %v", errno)
	}
	if _, got := m.b.backings.take(cancel); got {
		t.Error("read-only open of a 3-byte file: given a backing file")
	}
	fh.(gofs.FileReleaser).Release(ctx)
	if got, err := os.ReadFile(filepath.Join(m.Dir(), "small")); err != nil || string(got) != "old" {
		t.Errorf("read small: %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(f.Root(), "cache", mustID(t, f, "b", "small"))); !os.IsNotExist(err) {
		t.Errorf("reading a 3-byte file wrote its cache file (stat: %v)", err)
	}
}
