package virtio

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestFSForkGoesOn: a clone's device, given its parent's state, answers
// the node ids and the open file handle the parent's guest holds, from
// the clone's own copy of the directory; a write through the handle
// lands in the copy only, and the parent's handle still reads the
// parent's file.
func TestFSForkGoesOn(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"a": "parent data", "sub/f": "nested"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, dev := newFSDriver(t, dir)
	d.init()
	lookup := func(d *fsDriver, parent uint64, n string) uint64 {
		t.Helper()
		e, out := d.call(opLookup, parent, name(n), 256)
		if e != 0 {
			t.Fatalf("LOOKUP %s: %d", n, e)
		}
		return binary.LittleEndian.Uint64(out)
	}
	a := lookup(d, 1, "a")
	sub := lookup(d, 1, "sub")
	f := lookup(d, sub, "f")
	e, out := d.call(opOpen, a, []byte{2, 0, 0, 0, 0, 0, 0, 0}, 64) // O_RDWR
	if e != 0 {
		t.Fatalf("OPEN: %d", e)
	}
	fh := binary.LittleEndian.Uint64(out)
	read := func(d *fsDriver) string {
		t.Helper()
		rd := make([]byte, 40)
		binary.LittleEndian.PutUint64(rd, fh)
		binary.LittleEndian.PutUint32(rd[16:], 4096)
		e, out := d.call(opRead, a, rd, 4096+16)
		if e != 0 {
			t.Fatalf("READ: %d", e)
		}
		return string(out)
	}
	if got := read(d); got != "parent data" {
		t.Fatalf("parent reads %q", got)
	}

	d.tr.mu.Lock()
	state, err := dev.SaveState()
	d.tr.mu.Unlock()
	if err != nil || len(state) == 0 {
		t.Fatalf("SaveState: %d bytes, %v", len(state), err)
	}
	clone := t.TempDir()
	if out, err := exec.Command("cp", "-a", dir+"/.", clone).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(clone, "a"), []byte("clone data!"), 0o644); err != nil {
		t.Fatal(err)
	}
	d2, dev2 := newFSDriver(t, clone)
	if err := dev2.RestoreState(d2.tr, state); err != nil {
		t.Fatal(err)
	}
	if got := read(d2); got != "clone data!" {
		t.Fatalf("the clone reads %q through the parent's handle", got)
	}
	e, out = d2.call(opGetattr, f, make([]byte, 16), 256)
	if e != 0 || binary.LittleEndian.Uint64(out[16+8:]) != uint64(len("nested")) {
		t.Fatalf("GETATTR of the parent's nested node in the clone: %d %x", e, out)
	}
	wr := make([]byte, 40)
	binary.LittleEndian.PutUint64(wr, fh)
	binary.LittleEndian.PutUint32(wr[16:], 5)
	if e, _ = d2.call(opWrite, a, append(wr, "CLONE"...), 64); e != 0 {
		t.Fatalf("WRITE in the clone: %d", e)
	}
	if b, _ := os.ReadFile(filepath.Join(clone, "a")); string(b) != "CLONE data!" {
		t.Fatalf("the clone's file holds %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a")); string(b) != "parent data" {
		t.Fatalf("the clone's write reached the parent's file: %q", b)
	}
	if got := read(d); got != "parent data" {
		t.Fatalf("the parent reads %q after the fork", got)
	}
	// A new lookup in the clone gets an id the parent never gave.
	if g := lookup(d2, sub, "f"); g != f {
		t.Fatalf("the clone's lookup of a known name gave node %d, the parent's %d", g, f)
	}
}

// TestFSSaveStateBounds: a device keeps no state to carry when it cannot
// be carried: no session, a FUSE_INIT longer than the state decoder takes
// (a hostile guest's), or a request its server has not answered.
func TestFSSaveStateBounds(t *testing.T) {
	d, dev := newFSDriver(t, t.TempDir())
	save := func() []byte {
		d.tr.mu.Lock()
		defer d.tr.mu.Unlock()
		b, err := dev.SaveState()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if b := save(); b != nil {
		t.Fatalf("state without a session: %d bytes", len(b))
	}
	in := make([]byte, maxFSInit)
	binary.LittleEndian.PutUint32(in, 7)
	binary.LittleEndian.PutUint32(in[4:], 38)
	if e, _ := d.call(fuseInit, 0, in, 256); e != 0 {
		t.Fatalf("long INIT: %d", e)
	}
	if b := save(); b != nil {
		t.Fatalf("state with an INIT of %d bytes: %d bytes", fuseInHeaderSize+len(in), len(b))
	}
	d.init()
	d.tr.mu.Lock()
	dev.sess.pending[1<<60] = fsPending{}
	d.tr.mu.Unlock()
	if b := save(); b != nil {
		t.Fatalf("state with a request in flight: %d bytes", len(b))
	}
	d.tr.mu.Lock()
	delete(dev.sess.pending, 1<<60)
	d.tr.mu.Unlock()
	b := save()
	if b == nil {
		t.Fatal("no state for an idle session")
	}
	init, _, err := decodeFSState(b)
	if err != nil || len(init) != fuseInHeaderSize+64 {
		t.Fatalf("decoded INIT of %d bytes: %v", len(init), err)
	}
}

func FuzzFSState(f *testing.F) {
	init := make([]byte, fuseInHeaderSize+64)
	binary.LittleEndian.PutUint32(init, uint32(len(init)))
	binary.LittleEndian.PutUint32(init[4:], fuseInit)
	f.Add(encodeFSState(init, []byte("tables")))
	f.Add(encodeFSState(init, nil))
	f.Add([]byte(fsStateMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		init, tables, err := decodeFSState(data)
		if err != nil {
			return
		}
		if b := encodeFSState(init, tables); !bytes.Equal(b, data) {
			t.Fatalf("state changed in a round trip: %x", b)
		}
	})
}
