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

// TestPlainOpenHasNoPassthroughFd: go-fuse gives a node's backing file to
// every open whose handle has a PassthroughFd while an earlier passthrough
// handle is still being released, so a plain open that had one could read
// the file's content from before a write (seen as TestModel reading a file
// extended by a write with its old bytes).
func TestPlainOpenHasNoPassthroughFd(t *testing.T) {
	needFUSE(t)
	f := openTestFS(t)
	m, _ := mountNew(t, f, "b", map[string]string{"f": "old"})
	ctx := context.Background()
	var out fuse.EntryOut
	c, errno := m.b.rootNode.Lookup(ctx, "f", &out)
	if errno != 0 {
		t.Fatalf("lookup f: %v", errno)
	}
	n := c.Operations().(*node)
	for _, flags := range []uint32{syscall.O_WRONLY, syscall.O_RDWR} {
		fh, _, errno := n.Open(ctx, flags)
		if errno != 0 {
			t.Fatalf("open f (flags %#x): %v", flags, errno)
		}
		if _, ok := fh.(gofs.FilePassthroughFder); ok {
			t.Errorf("open f (flags %#x): a plain handle offers a passthrough fd", flags)
		}
		fh.(gofs.FileReleaser).Release(ctx)
	}
}
