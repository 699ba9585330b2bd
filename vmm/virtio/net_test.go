package virtio

import (
	"bytes"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// framePair returns two ends of a SOCK_SEQPACKET pair: one message per
// frame, as a TAP device carries them. The device gets the first.
func framePair(t *testing.T) (dev, peer *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	dev, peer = os.NewFile(uintptr(fds[0]), "dev"), os.NewFile(uintptr(fds[1]), "peer")
	t.Cleanup(func() { dev.Close(); peer.Close() })
	return dev, peer
}

var testMAC = net.HardwareAddr{0x02, 0x74, 0x69, 0x6e, 0x65, 0x01}

func frame(n int, fill byte) []byte {
	f := bytes.Repeat([]byte{fill}, n)
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:], testMAC)
	f[12], f[13] = 0x08, 0x00
	return f
}

func newNetDriver(t *testing.T) (*testDriver, *Net, *os.File) {
	dev, peer := framePair(t)
	n := &Net{MAC: testMAC, Backend: dev}
	d := newTestDriver(t, n, 4<<20)
	n.Start(d.tr)
	t.Cleanup(func() { n.Close() })
	return d, n, peer
}

// TestNetConfigMAC: the driver reads the MAC from configuration space
// and VIRTIO_NET_F_MAC is offered.
func TestNetConfigMAC(t *testing.T) {
	d, _, _ := newNetDriver(t)
	var got [6]byte
	for i := range got {
		var b [1]byte
		d.tr.Read(testBase+RegConfig+uint64(i), b[:])
		got[i] = b[0]
	}
	if !bytes.Equal(got[:], testMAC) {
		t.Fatalf("config MAC %x, want %s", got, testMAC)
	}
	if d.read(RegDeviceID) != TypeNet || !d.tr.Negotiated(NetFeatureMAC) {
		t.Fatal("not a net device with VIRTIO_NET_F_MAC negotiated")
	}
}

// TestNetTX: a transmit chain of header and frame (split over two
// descriptors, as Linux may send it) reaches the backend as exactly the
// frame; malformed requests (offloads not offered, a runt frame, no
// whole header) are returned to the guest unsent and counted, and the
// device goes on.
func TestNetTX(t *testing.T) {
	d, n, peer := newNetDriver(t)
	f := frame(100, 0xab)
	hdr := make([]byte, NetHeaderSize)
	d.add(1, buf{data: hdr}, buf{data: f})
	d.notify(1)
	got := make([]byte, MaxNetPacket)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, err := peer.Read(got)
	if err != nil || !bytes.Equal(got[:k], f) {
		t.Fatalf("backend got %d bytes (%v), want the %d-byte frame", k, err, len(f))
	}
	if u := d.used(1); len(u) != 1 || u[0][1] != 0 {
		t.Fatalf("used %v", u)
	}
	bad := append([]byte{1}, make([]byte, NetHeaderSize-1)...) // NEEDS_CSUM
	d.add(1, buf{data: append(bad, f...)})
	gso := make([]byte, NetHeaderSize)
	gso[1] = 1 // GSO TCPv4
	d.add(1, buf{data: append(gso, f...)})
	d.add(1, buf{data: append(make([]byte, NetHeaderSize), f[:13]...)})
	d.add(1, buf{data: hdr[:5]})
	d.notify(1)
	if u := d.used(1); len(u) != 4 {
		t.Fatalf("malformed requests: used %v", u)
	}
	if _, tx := n.Stats(); tx != 4 || d.failed() {
		t.Fatalf("tx errors %d, failed %v", tx, d.failed())
	}
	peer.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if k, err := peer.Read(got); err == nil {
		t.Fatalf("a malformed request reached the backend: %d bytes", k)
	}
	// A chain longer than MaxNetPacket is a malformed chain: the device
	// stops until reset, the host does not copy it.
	d.add(1, buf{data: make([]byte, MaxNetPacket)}, buf{data: make([]byte, 1)})
	d.notify(1)
	if !d.failed() {
		t.Fatal("a chain over MaxNetPacket did not stop the device")
	}
}

// waitUsed polls queue q's used ring under the transport's lock.
func waitUsed(t *testing.T, d *testDriver, q int) [][2]uint32 {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		d.tr.mu.Lock()
		u := d.used(q)
		d.tr.mu.Unlock()
		if len(u) > 0 {
			return u
		}
	}
	t.Fatalf("nothing used on queue %d", q)
	return nil
}

// TestNetRX: a frame from the backend lands in the guest's receive
// buffer behind a header with num_buffers 1; a frame that arrives before
// the guest offered buffers waits and is delivered once it does; a frame
// larger than the buffer is dropped and counted, and the buffer serves
// the next frame.
func TestNetRX(t *testing.T) {
	d, n, peer := newNetDriver(t)
	f := frame(60, 0x11)
	if _, err := peer.Write(f); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the frame waits: no buffer yet
	d.tr.mu.Lock()
	head := d.add(0, buf{writable: NetHeaderSize + 1514})
	d.tr.mu.Unlock()
	d.notify(0)
	u := waitUsed(t, d, 0)
	if len(u) != 1 || u[0][0] != uint32(head) || u[0][1] != uint32(NetHeaderSize+len(f)) {
		t.Fatalf("used %v, want head %d with %d bytes", u, head, NetHeaderSize+len(f))
	}
	b := d.descBuf(0, head)
	want := make([]byte, NetHeaderSize)
	want[10] = 1
	if !bytes.Equal(b[:NetHeaderSize], want) || !bytes.Equal(b[NetHeaderSize:NetHeaderSize+len(f)], f) {
		t.Fatalf("buffer holds %x", b[:NetHeaderSize+len(f)])
	}

	d.tr.mu.Lock()
	head = d.add(0, buf{writable: NetHeaderSize + 200})
	d.tr.mu.Unlock()
	d.notify(0)
	if _, err := peer.Write(frame(1000, 0x22)); err != nil {
		t.Fatal(err)
	}
	small := frame(150, 0x33)
	if _, err := peer.Write(small); err != nil {
		t.Fatal(err)
	}
	u = waitUsed(t, d, 0)
	if len(u) != 1 || u[0][0] != uint32(head) || u[0][1] != uint32(NetHeaderSize+len(small)) {
		t.Fatalf("used %v after an oversized frame", u)
	}
	if b := d.descBuf(0, head); !bytes.Equal(b[NetHeaderSize:NetHeaderSize+len(small)], small) {
		t.Fatal("the buffer does not hold the frame after the dropped one")
	}
	if rx, _ := n.Stats(); rx != 1 || d.failed() {
		t.Fatalf("rx dropped %d, failed %v", rx, d.failed())
	}
}
