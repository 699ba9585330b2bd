package linux

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// readPkgLength decodes an AML PkgLength at b: the length (counting its
// own bytes) and how many bytes the encoding took.
func readPkgLength(b []byte) (int, int) {
	n := int(b[0] >> 6)
	if n == 0 {
		return int(b[0] & 0x3f), 1
	}
	l := int(b[0] & 0x0f)
	for i := 1; i <= n; i++ {
		l |= int(b[i]) << (4 + 8*(i-1))
	}
	return l, n + 1
}

// TestVirtioDSDT walks the DSDT's AML as an interpreter would: \_S5,
// then Scope (\_SB) holding one Device per virtio slot whose _HID is
// LNRO0005 and whose _CRS names the slot's window and GSI.
func TestVirtioDSDT(t *testing.T) {
	mem := make([]byte, 2<<20)
	slots := []VirtioSlot{{VirtioBase, 16}, {VirtioBase + VirtioStride, 17}, {VirtioBase + 2*VirtioStride, 18}, {VirtioBase + 3*VirtioStride, 19}}
	if _, err := writeACPI(mem, 2, slots...); err != nil {
		t.Fatal(err)
	}
	n := le.Uint32(mem[dsdtAddr+4:])
	dsdt := mem[dsdtAddr : dsdtAddr+int(n)]
	if string(dsdt[:4]) != "DSDT" || sum8(dsdt) != 0 {
		t.Fatal("DSDT signature or checksum")
	}
	aml := dsdt[sdtHdrSize:]
	if !bytes.HasPrefix(aml, s5AML) {
		t.Fatal("\\_S5 missing")
	}
	aml = aml[len(s5AML):]
	if aml[0] != 0x10 {
		t.Fatalf("want ScopeOp, got %#x", aml[0])
	}
	l, k := readPkgLength(aml[1:])
	if 1+l != len(aml) || string(aml[1+k:1+k+4]) != "_SB_" {
		t.Fatalf("scope length %d, AML left %d", l, len(aml)-1)
	}
	body := aml[1+k+4:]
	for i, s := range slots {
		if body[0] != 0x5b || body[1] != 0x82 {
			t.Fatalf("device %d: want DeviceOp, got % x", i, body[:2])
		}
		l, k := readPkgLength(body[2:])
		dev := body[2+k : 2+l]
		if !bytes.Contains(dev, []byte("_HID\x0dLNRO0005\x00")) {
			t.Fatalf("device %d has no LNRO0005 _HID", i)
		}
		c := bytes.Index(dev, []byte("_CRS\x11"))
		if c < 0 {
			t.Fatalf("device %d has no _CRS", i)
		}
		crs := dev[c+5:]
		bl, bk := readPkgLength(crs)
		buf := crs[bk:bl]
		if buf[0] != 0x0a || int(buf[1]) != len(buf)-2 {
			t.Fatalf("device %d: buffer size % x for %d bytes", i, buf[:2], len(buf)-2)
		}
		res := buf[2:]
		if res[0] != 0x86 || binary.LittleEndian.Uint32(res[4:]) != uint32(s.Base) {
			t.Fatalf("device %d: Memory32Fixed % x", i, res[:12])
		}
		irq := res[12:]
		if irq[0] != 0x89 || irq[3]&2 == 0 || binary.LittleEndian.Uint32(irq[5:]) != s.GSI {
			t.Fatalf("device %d: interrupt % x", i, irq[:9])
		}
		if irq[9] != 0x79 {
			t.Fatalf("device %d: no end tag", i)
		}
		body = body[2+l:]
	}
	if len(body) != 0 {
		t.Fatalf("%d bytes after the devices", len(body))
	}
	for _, n := range []int{0, 10, 61, 62, 63, 100, 4000, 4093, 5000} {
		l, _ := readPkgLength(pkgLength(n))
		if l != n+len(pkgLength(n)) {
			t.Errorf("pkgLength(%d) decodes to %d", n, l)
		}
	}
}
