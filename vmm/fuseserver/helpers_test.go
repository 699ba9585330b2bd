package fuseserver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// never is a cancel channel that is never closed.
var never = make(chan struct{})

func hdr(id uint64) fuse.InHeader {
	return fuse.InHeader{NodeId: id, Caller: fuse.Caller{Owner: fuse.Owner{Uid: 0, Gid: 0}}}
}

func newServer(t *testing.T, root string) *Server {
	t.Helper()
	s, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(s.rootFd) })
	return s
}

func lookup(t *testing.T, s *Server, parent uint64, name string) uint64 {
	t.Helper()
	var out fuse.EntryOut
	h := hdr(parent)
	if code := s.Lookup(never, &h, name, &out); !code.Ok() {
		t.Fatalf("lookup %d/%s: %v", parent, name, code)
	}
	return out.NodeId
}

func mkdir(t *testing.T, s *Server, parent uint64, name string) uint64 {
	t.Helper()
	var out fuse.EntryOut
	in := fuse.MkdirIn{InHeader: hdr(parent), Mode: 0o755}
	if code := s.Mkdir(never, &in, name, &out); !code.Ok() {
		t.Fatalf("mkdir %d/%s: %v", parent, name, code)
	}
	return out.NodeId
}

func create(t *testing.T, s *Server, parent uint64, name string, flags uint32) (id, fh uint64) {
	t.Helper()
	var out fuse.CreateOut
	in := fuse.CreateIn{InHeader: hdr(parent), Flags: flags, Mode: 0o644}
	if code := s.Create(never, &in, name, &out); !code.Ok() {
		t.Fatalf("create %d/%s: %v", parent, name, code)
	}
	return out.NodeId, out.Fh
}

func open(t *testing.T, s *Server, id uint64, flags uint32) uint64 {
	t.Helper()
	var out fuse.OpenOut
	in := fuse.OpenIn{InHeader: hdr(id), Flags: flags}
	if code := s.Open(never, &in, &out); !code.Ok() {
		t.Fatalf("open %d: %v", id, code)
	}
	return out.Fh
}

func write(t *testing.T, s *Server, fh uint64, off uint64, data string) {
	t.Helper()
	in := fuse.WriteIn{Fh: fh, Offset: off, Size: uint32(len(data))}
	n, code := s.Write(never, &in, []byte(data))
	if !code.Ok() || int(n) != len(data) {
		t.Fatalf("write fh %d: %d, %v", fh, n, code)
	}
}

func read(s *Server, fh uint64, off uint64, size int) (string, fuse.Status) {
	buf := make([]byte, size)
	in := fuse.ReadIn{Fh: fh, Offset: off, Size: uint32(size)}
	r, code := s.Read(never, &in, buf)
	if !code.Ok() {
		return "", code
	}
	b, code := r.Bytes(buf)
	return string(b), code
}

func release(s *Server, fh uint64) {
	s.Release(never, &fuse.ReleaseIn{Fh: fh})
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readDir answers one READDIR (or READDIRPLUS) of in, parsed: the entries,
// and with plus their lookups.
func readDir(s *Server, in *fuse.ReadIn, plus bool) ([]fuse.DirEntry, []fuse.EntryOut, fuse.Status, error) {
	out := fuse.NewDirEntryList(make([]byte, in.Size), in.Offset)
	var code fuse.Status
	if plus {
		code = s.ReadDirPlus(never, in, out)
	} else {
		code = s.ReadDir(never, in, out)
	}
	if !code.Ok() {
		return nil, nil, code, nil
	}
	if plus {
		ents, outs, err := fuse.ParseDirLookupEntries(out.Bytes())
		return ents, outs, code, err
	}
	ents, err := fuse.ParseDirEntries(out.Bytes())
	return ents, nil, code, err
}

// listAll reads a directory handle to the end, as the kernel does.
func listAll(t *testing.T, s *Server, fh uint64, plus bool) []fuse.DirEntry {
	t.Helper()
	var all []fuse.DirEntry
	off := uint64(0)
	for range 100000 {
		es, _, code, err := readDir(s, &fuse.ReadIn{Fh: fh, Offset: off, Size: 4096}, plus)
		if !code.Ok() {
			t.Fatalf("readdir: %v", code)
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(es) == 0 {
			return all
		}
		all = append(all, es...)
		off = es[len(es)-1].Off
	}
	t.Fatal("readdir does not end")
	return nil
}
