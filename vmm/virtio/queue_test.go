package virtio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func TestRNGFillsBuffers(t *testing.T) {
	d := newTestDriver(t, &RNG{}, 4<<20)
	h1 := d.add(0, buf{writable: 64})
	h2 := d.add(0, buf{writable: 32}, buf{writable: 32})
	d.notify(0)
	u := d.used(0)
	if len(u) != 2 || u[0] != [2]uint32{uint32(h1), 64} || u[1] != [2]uint32{uint32(h2), 64} {
		t.Fatalf("used ring %v", u)
	}
	a := d.descBuf(0, h1)
	if bytes.Equal(a, make([]byte, 64)) {
		t.Fatal("rng buffer left zero")
	}
	if d.irqs == 0 || d.read(RegInterruptStat)&IntUsedBuffer == 0 {
		t.Fatal("no used-buffer interrupt")
	}
	d.write(RegInterruptACK, IntUsedBuffer)
	if d.read(RegInterruptStat) != 0 {
		t.Fatal("interrupt not acknowledged")
	}
}

// TestHostileChains: every kind of bad descriptor ends in an error for
// the device (DEVICE_NEEDS_RESET, Err naming it), never a panic, and a
// reset brings the device back.
func TestHostileChains(t *testing.T) {
	cases := []struct {
		name string
		bad  func(d *testDriver)
		want string
	}{
		{"address outside RAM", func(d *testDriver) {
			d.putDesc(0, 0, uint64(len(d.mem))-8, 64, DescWrite, 0)
			d.publish(0, 0)
		}, "outside RAM"},
		{"address wraps", func(d *testDriver) {
			d.putDesc(0, 0, ^uint64(0)-4, 64, DescWrite, 0)
			d.publish(0, 0)
		}, "outside RAM"},
		{"loop", func(d *testDriver) {
			d.putDesc(0, 0, 0x2000, 8, DescWrite|DescNext, 1)
			d.putDesc(0, 1, 0x3000, 8, DescWrite|DescNext, 0)
			d.publish(0, 0)
		}, "a loop"},
		{"self loop", func(d *testDriver) {
			d.putDesc(0, 3, 0x2000, 8, DescWrite|DescNext, 3)
			d.publish(0, 3)
		}, "a loop"},
		{"oversized length", func(d *testDriver) {
			d.putDesc(0, 0, 0x2000, 0xffffffff, DescWrite, 0)
			d.publish(0, 0)
		}, "outside RAM"},
		{"next outside queue", func(d *testDriver) {
			d.putDesc(0, 0, 0x2000, 8, DescWrite|DescNext, 999)
			d.publish(0, 0)
		}, "outside the queue"},
		{"head outside queue", func(d *testDriver) {
			d.publish(0, 40000)
		}, "head index"},
		{"indirect", func(d *testDriver) {
			d.putDesc(0, 0, 0x2000, 64, DescIndirect, 0)
			d.publish(0, 0)
		}, "indirect"},
		{"wrapped index", func(d *testDriver) {
			dq := &d.queues[0]
			binary.LittleEndian.PutUint16(d.mem[dq.avail+2:], dq.availIdx+dq.size+1)
		}, "ahead"},
		{"wrapped index far", func(d *testDriver) {
			dq := &d.queues[0]
			binary.LittleEndian.PutUint16(d.mem[dq.avail+2:], dq.availIdx-1)
		}, "ahead"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newTestDriver(t, &RNG{}, 1<<21)
			c.bad(d)
			d.notify(0)
			if !d.failed() {
				t.Fatal("device did not fail")
			}
			err := d.tr.Err()
			if !errors.Is(err, ErrBadGuest) || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
				t.Fatalf("error %v, want ErrBadGuest mentioning %q", err, c.want)
			}
			if d.read(RegInterruptStat)&IntConfigChange == 0 {
				t.Fatal("no configuration-change interrupt for the failure")
			}
			// Further notifications are ignored until a reset.
			d.notify(0)
			d.write(RegStatus, 0)
			if d.failed() || d.tr.Err() != nil {
				t.Fatal("reset did not clear the failure")
			}
		})
	}
}

func TestQueueSetupRejectsBadGeometry(t *testing.T) {
	mem := make(Memory, 1<<20)
	for _, q := range []Queue{
		{Size: 3, Max: 16},
		{Size: 32, Max: 16},
		{Size: 16, Max: 16, Desc: 1 << 20},
		{Size: 16, Max: 16, Desc: 8},
		{Size: 16, Max: 16, Used: ^uint64(0) - 3},
	} {
		if err := q.check(mem); !errors.Is(err, ErrBadGuest) {
			t.Errorf("queue %+v accepted (%v)", q, err)
		}
	}
}

func TestReadableAfterWritable(t *testing.T) {
	mem := make(Memory, 1<<20)
	q := Queue{Size: 4, Max: 4, Desc: 0x1000, Avail: 0x2000, Used: 0x3000}
	put := func(i int, addr uint64, n uint32, flags, next uint16) {
		e := mem[0x1000+16*i:]
		le.PutUint64(e, addr)
		le.PutUint32(e[8:], n)
		le.PutUint16(e[12:], flags)
		le.PutUint16(e[14:], next)
	}
	put(0, 0x4000, 8, DescWrite|DescNext, 1)
	put(1, 0x5000, 8, 0, 0)
	le.PutUint16(mem[0x2002:], 1)
	if _, err := q.Pop(mem, 1<<20); !errors.Is(err, ErrBadGuest) {
		t.Fatalf("readable after writable accepted: %v", err)
	}
	// A chain over the byte bound.
	put(0, 0x4000, 0x1000, DescNext, 1)
	put(1, 0x5000, 0x1000, DescWrite, 0)
	le.PutUint16(mem[0x2004+2:], 0)
	le.PutUint16(mem[0x2002:], 2)
	if _, err := q.Pop(mem, 0x1800); !errors.Is(err, ErrBadGuest) {
		t.Fatalf("oversized chain accepted: %v", err)
	}
}

func TestStateCarriesQueues(t *testing.T) {
	d := newTestDriver(t, &RNG{}, 4<<20)
	d.add(0, buf{writable: 16})
	d.notify(0)
	st := d.tr.State()
	// A second transport over a copy of the memory (a fork) continues
	// where the first left off.
	mem2 := append(Memory(nil), d.mem...)
	t2 := NewTransport(testBase, mem2, &RNG{}, nil)
	if err := t2.SetState(st); err != nil {
		t.Fatal(err)
	}
	d.mem, d.tr = mem2, t2
	h := d.add(0, buf{writable: 16})
	d.notify(0)
	if u := d.used(0); len(u) != 2 || u[1][0] != uint32(h) {
		t.Fatalf("used after restore %v", u)
	}
}
