package virtio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// FUSE opcodes the tests send.
const (
	opLookup  = 1
	opGetattr = 3
	opSymlink = 6
	opMknod   = 8
	opOpen    = 14
	opRead    = 15
	opWrite   = 16
	opCreate  = 35
)

// noExport is a connection to a server that has no tables to export.
type noExport struct{ io.ReadWriteCloser }

func (noExport) Export() ([]byte, error) { return nil, errors.New("no tables") }

type fsDriver struct {
	*testDriver
	unique uint64
}

func newFSDriver(t *testing.T, dir string) (*fsDriver, *FS) {
	dev := &FS{Tag: "project", Connect: LoopbackServer(dir)}
	d := &fsDriver{testDriver: newTestDriver(t, dev, 8<<20)}
	t.Cleanup(func() { dev.Close(d.tr) })
	return d, dev
}

// call sends one request on the request queue with room bytes of reply
// buffer and waits for its answer: the error (negative errno) and the
// reply body.
func (d *fsDriver) call(op uint32, node uint64, args []byte, room int) (int32, []byte) {
	d.t.Helper()
	d.unique++
	h := make([]byte, fuseInHeaderSize)
	binary.LittleEndian.PutUint32(h, uint32(fuseInHeaderSize+len(args)))
	binary.LittleEndian.PutUint32(h[4:], op)
	binary.LittleEndian.PutUint64(h[8:], d.unique)
	binary.LittleEndian.PutUint64(h[16:], node)
	bufs := []buf{{data: h}}
	if len(args) > 0 {
		bufs = append(bufs, buf{data: args})
	}
	bufs = append(bufs, buf{writable: room})
	head := d.add(1, bufs...)
	d.notify(1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.tr.mu.Lock()
		u := d.used(1)
		d.tr.mu.Unlock()
		if len(u) > 0 {
			if len(u) != 1 || uint16(u[0][0]) != head {
				d.t.Fatalf("op %d: used %v, want head %d", op, u, head)
			}
			out := d.descBuf(1, head+uint16(len(bufs))-1)[:u[0][1]]
			if len(out) < fuseOutHeaderSize {
				d.t.Fatalf("op %d: reply of %d bytes", op, len(out))
			}
			if binary.LittleEndian.Uint64(out[8:]) != d.unique || int(binary.LittleEndian.Uint32(out)) != len(out) {
				d.t.Fatalf("op %d: reply header %x", op, out[:fuseOutHeaderSize])
			}
			return int32(binary.LittleEndian.Uint32(out[4:])), out[fuseOutHeaderSize:]
		}
		if time.Now().After(deadline) || d.failed() {
			d.t.Fatalf("op %d: no answer (device error %v)", op, d.tr.Err())
		}
		time.Sleep(time.Millisecond)
	}
}

func (d *fsDriver) init() {
	d.t.Helper()
	in := make([]byte, 64)
	binary.LittleEndian.PutUint32(in, 7)
	binary.LittleEndian.PutUint32(in[4:], 38)
	binary.LittleEndian.PutUint32(in[8:], 128<<10)
	if e, out := d.call(fuseInit, 0, in, 256); e != 0 || binary.LittleEndian.Uint32(out) != 7 {
		d.t.Fatalf("INIT: error %d, reply %x", e, out)
	}
}

func name(s string) []byte { return append([]byte(s), 0) }

// TestFSLoopback drives a go-fuse loopback server of a real directory
// through the device as Linux's driver does: INIT, LOOKUP, GETATTR,
// OPEN and READ of a file that is there, CREATE and WRITE of one that
// then exists on the host.
func TestFSLoopback(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("hello from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, _ := newFSDriver(t, dir)
	var cfg [FSTagSize + 4]byte
	for i := range cfg {
		var b [1]byte
		d.tr.Read(testBase+RegConfig+uint64(i), b[:])
		cfg[i] = b[0]
	}
	if string(bytes.TrimRight(cfg[:FSTagSize], "\x00")) != "project" || binary.LittleEndian.Uint32(cfg[FSTagSize:]) != 1 {
		t.Fatalf("config space %q", cfg)
	}
	if v := d.read(RegShmLenLow); v != 0xffffffff {
		t.Fatalf("shared memory region length %#x, want none", v)
	}
	// Before INIT, there is no session.
	if e, _ := d.call(opLookup, 1, name("hello"), 256); e != -int32(syscall.EIO) {
		t.Fatalf("LOOKUP before INIT: %d", e)
	}
	d.init()
	e, out := d.call(opLookup, 1, name("hello"), 256)
	if e != 0 || len(out) < 128 {
		t.Fatalf("LOOKUP: %d %x", e, out)
	}
	node := binary.LittleEndian.Uint64(out)
	if size := binary.LittleEndian.Uint64(out[40+8:]); size != 20 {
		t.Fatalf("LOOKUP size %d", size)
	}
	e, out = d.call(opGetattr, node, make([]byte, 16), 256)
	if e != 0 || binary.LittleEndian.Uint64(out[16+8:]) != 20 {
		t.Fatalf("GETATTR: %d %x", e, out)
	}
	e, out = d.call(opOpen, node, make([]byte, 8), 64)
	if e != 0 {
		t.Fatalf("OPEN: %d", e)
	}
	fh := binary.LittleEndian.Uint64(out)
	rd := make([]byte, 40)
	binary.LittleEndian.PutUint64(rd, fh)
	binary.LittleEndian.PutUint32(rd[16:], 4096)
	if e, out = d.call(opRead, node, rd, 4096+16); e != 0 || string(out) != "hello from the host\n" {
		t.Fatalf("READ: %d %q", e, out)
	}
	// A reply larger than the room the driver gave: EIO for that request.
	if e, _ = d.call(opRead, node, rd, 16+4); e != -int32(syscall.EIO) {
		t.Fatalf("READ into 4 bytes: %d", e)
	}
	// CREATE and WRITE land in the host directory.
	cr := make([]byte, 16)
	binary.LittleEndian.PutUint32(cr, uint32(os.O_WRONLY|os.O_CREATE))
	binary.LittleEndian.PutUint32(cr[4:], 0o100644)
	e, out = d.call(opCreate, 1, append(cr, name("written")...), 256)
	if e != 0 {
		t.Fatalf("CREATE: %d", e)
	}
	wnode, wfh := binary.LittleEndian.Uint64(out), binary.LittleEndian.Uint64(out[128:])
	wr := make([]byte, 40)
	binary.LittleEndian.PutUint64(wr, wfh)
	binary.LittleEndian.PutUint32(wr[16:], 11)
	if e, _ = d.call(opWrite, wnode, append(wr, "from guest\n"...), 64); e != 0 {
		t.Fatalf("WRITE: %d", e)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "written")); err != nil || string(b) != "from guest\n" {
		t.Fatalf("host file %q %v", b, err)
	}
	// A symlink to / stays inside the directory: the server is chrooted.
	e, out = d.call(opSymlink, 1, append(name("up"), name("/")...), 256)
	if e != 0 {
		t.Fatalf("SYMLINK: %d", e)
	}
	link := binary.LittleEndian.Uint64(out)
	if e, _ = d.call(opLookup, link, name("proc"), 256); e == 0 {
		t.Fatal("LOOKUP under a symlink to / found the host's /proc")
	}
	// A device node the guest makes is no host device to the server: its
	// directory is bound nodev in the server's mount namespace.
	mk := make([]byte, 16)
	binary.LittleEndian.PutUint32(mk, syscall.S_IFCHR|0o666)
	binary.LittleEndian.PutUint32(mk[4:], 1<<8|3) // 1:3, /dev/null
	if e, out = d.call(opMknod, 1, append(mk, name("null")...), 256); e == 0 {
		if e, _ = d.call(opOpen, binary.LittleEndian.Uint64(out), []byte{2, 0, 0, 0, 0, 0, 0, 0}, 64); e == 0 {
			t.Fatal("the guest opened a host device through a node it made")
		}
	}
	// An unknown node id is an error for that request, not a crash.
	if e, _ = d.call(opGetattr, 1<<40, make([]byte, 16), 256); e == 0 {
		t.Fatal("GETATTR of an unknown node succeeded")
	}
	if e, _ = d.call(opGetattr, 1, make([]byte, 16), 256); e != 0 {
		t.Fatalf("GETATTR of the root after the unknown node: %d", e)
	}
}

// TestFSHostileChain: a request whose header claims more bytes than its
// chain holds stops the device (the driver must reset it), and a chain
// without a header does too; the host goes on.
func TestFSHostileChain(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  []byte
	}{
		{"long", func() []byte {
			h := make([]byte, fuseInHeaderSize)
			binary.LittleEndian.PutUint32(h, 1<<30)
			binary.LittleEndian.PutUint32(h[4:], opLookup)
			return h
		}()},
		{"short", make([]byte, 8)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newFSDriver(t, t.TempDir())
			d.add(1, buf{data: tc.req}, buf{writable: 64})
			d.notify(1)
			if !d.failed() || d.tr.Err() == nil {
				t.Fatal("hostile chain accepted")
			}
		})
	}
}

// TestFSOutOfOrder puts a server written here behind the device: it takes
// three requests, sends a notification (unique 0) and a reply for a
// request it never got, then answers the three in reverse order, one of
// them larger than its chain's room. Each chain gets its own answer under
// the guest's unique, the large one -EIO; the device gave the server ids
// of its own even though the guest used one unique three times.
func TestFSOutOfOrder(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	srv := os.NewFile(uintptr(fds[1]), "server")
	defer srv.Close()
	syscall.SetNonblock(fds[0], true)
	dev := &FS{Tag: "t", Connect: func([]byte) (FSConn, error) { return noExport{os.NewFile(uintptr(fds[0]), "device")}, nil }}
	d := &fsDriver{testDriver: newTestDriver(t, dev, 8<<20)}
	defer dev.Close(d.tr)
	heads := make([]uint16, 3)
	rooms := []int{64, 64, 20}
	for i := range heads {
		h := make([]byte, fuseInHeaderSize)
		binary.LittleEndian.PutUint32(h, fuseInHeaderSize)
		binary.LittleEndian.PutUint32(h[4:], []uint32{fuseInit, opGetattr, opGetattr}[i])
		binary.LittleEndian.PutUint64(h[8:], 5) // the same unique each time
		heads[i] = d.add(1, buf{data: h}, buf{writable: rooms[i]})
	}
	d.notify(1)
	var ids []uint64
	b := make([]byte, 4096)
	for range heads {
		n, err := srv.Read(b)
		if err != nil || n != fuseInHeaderSize {
			t.Fatalf("server read %d %v", n, err)
		}
		ids = append(ids, binary.LittleEndian.Uint64(b[8:]))
	}
	if ids[0] == ids[1] || ids[1] == ids[2] || ids[0] == ids[2] {
		t.Fatalf("the server saw ids %v", ids)
	}
	reply := func(unique uint64, body []byte) {
		m := make([]byte, fuseOutHeaderSize, fuseOutHeaderSize+len(body))
		binary.LittleEndian.PutUint32(m, uint32(fuseOutHeaderSize+len(body)))
		binary.LittleEndian.PutUint64(m[8:], unique)
		if _, err := srv.Write(append(m, body...)); err != nil {
			t.Fatal(err)
		}
	}
	reply(0, []byte("notification"))
	reply(ids[2]+100, []byte("nobody asked"))
	for i := 2; i >= 0; i-- {
		reply(ids[i], bytes.Repeat([]byte{byte('a' + i)}, 8))
	}
	got := map[uint16]uint32{}
	for deadline := time.Now().Add(10 * time.Second); len(got) < 3; {
		d.tr.mu.Lock()
		for _, u := range d.used(1) {
			got[uint16(u[0])] = u[1]
		}
		d.tr.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("answers %v", got)
		}
		time.Sleep(time.Millisecond)
	}
	for i, h := range heads {
		out := d.descBuf(1, h+1)[:got[h]]
		if binary.LittleEndian.Uint64(out[8:]) != 5 {
			t.Errorf("chain %d: unique %d, want the guest's", i, binary.LittleEndian.Uint64(out[8:]))
		}
		e := int32(binary.LittleEndian.Uint32(out[4:]))
		switch {
		case rooms[i] < fuseOutHeaderSize+8:
			if e != -int32(syscall.EIO) || len(out) != fuseOutHeaderSize {
				t.Errorf("chain %d (too small): error %d, %d bytes", i, e, len(out))
			}
		case e != 0 || !bytes.Equal(out[fuseOutHeaderSize:], bytes.Repeat([]byte{byte('a' + i)}, 8)):
			t.Errorf("chain %d: %d %q", i, e, out)
		}
	}
	// DESTROY ends the session: the device answers it and closes its end.
	h := make([]byte, fuseInHeaderSize)
	binary.LittleEndian.PutUint32(h, fuseInHeaderSize)
	binary.LittleEndian.PutUint32(h[4:], fuseDestroy)
	d.add(1, buf{data: h}, buf{writable: 64})
	d.notify(1)
	srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := srv.Read(b); n != 0 {
		t.Fatalf("after DESTROY the server read %d bytes (%v), want the end", n, err)
	}
}

// serverPids lists the processes serving dir (their environment names
// it).
func serverPids(t *testing.T, dir string) []string {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(b, []byte(envFSRoot+"="+dir+"\x00")) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// TestFSServerEndsWithSession: a guest that blocks a handler of its
// server (an open of a FIFO nobody writes) does not keep the server
// process once the session ends.
func TestFSServerEndsWithSession(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, dev := newFSDriver(t, dir)
	d.init()
	e, out := d.call(opLookup, 1, name("fifo"), 256)
	if e != 0 {
		t.Fatalf("LOOKUP: %d", e)
	}
	if len(serverPids(t, dir)) != 1 {
		t.Fatalf("server processes %v, want one", serverPids(t, dir))
	}
	h := make([]byte, fuseInHeaderSize)
	binary.LittleEndian.PutUint32(h, fuseInHeaderSize+8)
	binary.LittleEndian.PutUint32(h[4:], opOpen)
	binary.LittleEndian.PutUint64(h[8:], 99)
	binary.LittleEndian.PutUint64(h[16:], binary.LittleEndian.Uint64(out))
	d.add(1, buf{data: h}, buf{data: make([]byte, 8)}, buf{writable: 64})
	d.notify(1)
	time.Sleep(100 * time.Millisecond) // the server is in open(2) now
	t0 := time.Now()
	dev.Close(d.tr)
	// Close waits for the process: it is gone now, well before the kill
	// after 5 s.
	if p := serverPids(t, dir); len(p) > 0 || time.Since(t0) > 4*time.Second {
		t.Fatalf("server processes %v after the session ended (in %v)", p, time.Since(t0))
	}
}
