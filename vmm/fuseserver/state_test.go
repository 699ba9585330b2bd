package fuseserver

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// populated returns the export of a server with nested, detached, forgotten
// and open nodes.
func populated(t testing.TB) []byte {
	dir := t.TempDir()
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(s.rootFd)
	must := func(code fuse.Status) {
		if !code.Ok() {
			t.Fatal(code)
		}
	}
	var eo fuse.EntryOut
	must(s.Mkdir(never, &fuse.MkdirIn{InHeader: hdr(rootID), Mode: 0o755}, "a", &eo))
	a := eo.NodeId
	must(s.Mkdir(never, &fuse.MkdirIn{InHeader: hdr(a), Mode: 0o755}, "b", &eo))
	b := eo.NodeId
	var co fuse.CreateOut
	must(s.Create(never, &fuse.CreateIn{InHeader: hdr(b), Flags: unix.O_RDWR, Mode: 0o600}, "f", &co))
	must(s.Create(never, &fuse.CreateIn{InHeader: hdr(rootID), Flags: unix.O_WRONLY | unix.O_APPEND, Mode: 0o600}, "z", &co))
	h := hdr(rootID)
	must(s.Unlink(never, &h, "z")) // detached, still open
	must(s.Symlink(never, &h, "a/b", "link", &eo))
	s.Forget(eo.NodeId, 1)
	var oo fuse.OpenOut
	must(s.OpenDir(never, &fuse.OpenIn{InHeader: hdr(a)}, &oo))
	state, err := s.Export()
	if err != nil {
		t.Fatal(err)
	}
	return state
}

// bare is a server with no root fd, for decoding alone.
func bare() *Server {
	s := &Server{RawFileSystem: fuse.NewDefaultRawFileSystem(), rootFd: -1}
	s.reset()
	return s
}

func TestStateRoundTrip(t *testing.T) {
	state := populated(t)
	s := bare()
	if err := s.Import(state); err != nil {
		t.Fatal(err)
	}
	again, err := s.Export()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(state, again) {
		t.Fatalf("round trip differs:\n%x\n%x", state, again)
	}
	var detached int
	for _, n := range s.nodes {
		if n.parent == nil && n.id != rootID {
			detached++
		}
	}
	if detached != 1 || len(s.handles) != 3 {
		t.Fatalf("imported %d detached nodes and %d handles, want 1 and 3", detached, len(s.handles))
	}
}

func TestStateRefused(t *testing.T) {
	good := populated(t)
	le := binary.LittleEndian
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":     nil,
		"magic":     mutate(func(b []byte) []byte { b[7] = '2'; return b }),
		"truncated": good[:len(good)-1],
		"trailing":  append(bytes.Clone(good), 0),
		"nextNode":  mutate(func(b []byte) []byte { le.PutUint64(b[8:], 1); return b }),
		"nextFh":    mutate(func(b []byte) []byte { le.PutUint64(b[16:], 0); return b }),
		"count":     mutate(func(b []byte) []byte { le.PutUint32(b[24:], 1<<31); return b }),
		"parent":    mutate(func(b []byte) []byte { le.PutUint64(b[28+8:], 1<<50); return b }),
		"root id":   mutate(func(b []byte) []byte { le.PutUint64(b[28:], 1); return b }),
		"name":      mutate(func(b []byte) []byte { b[28+26] = '/'; return b }),
		"huge":      make([]byte, MaxState+1),
	}
	for name, state := range cases {
		if err := bare().Import(state); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzState(f *testing.F) {
	f.Add(populated(f))
	empty, _ := bare().Export()
	f.Add(empty)
	f.Fuzz(func(t *testing.T, state []byte) {
		s := bare()
		if err := s.Import(state); err != nil {
			return
		}
		first, err := s.Export()
		if err != nil {
			t.Fatal(err)
		}
		s2 := bare()
		if err := s2.Import(first); err != nil {
			t.Fatalf("re-import of an export: %v", err)
		}
		second, err := s2.Export()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, second) {
			t.Fatalf("export, import, export differs:\n%x\n%x", first, second)
		}
	})
}
