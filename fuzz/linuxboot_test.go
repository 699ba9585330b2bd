package fuzz

import (
	"encoding/binary"
	"errors"
	"testing"

	"tine/vmm/linux"
)

// seedBzImage is a minimal bzImage the loader accepts: 4 setup sectors, a
// 2.15 header and a 4 KiB kernel.
func seedBzImage() []byte {
	le := binary.LittleEndian
	img := make([]byte, 5*512+4096)
	img[0x1f1] = 4
	le.PutUint16(img[0x1fe:], 0xaa55)
	img[0x201] = 0x66
	le.PutUint32(img[0x202:], 0x53726448)
	le.PutUint16(img[0x206:], 0x020f)
	img[0x211] = 1
	le.PutUint32(img[0x22c:], 0x7fffffff)
	le.PutUint32(img[0x230:], 0x200000)
	img[0x234] = 1
	le.PutUint16(img[0x236:], 1)
	le.PutUint32(img[0x238:], 255)
	le.PutUint32(img[0x248:], 0x10)
	le.PutUint32(img[0x24c:], 0x100)
	le.PutUint64(img[0x258:], 0x200000)
	le.PutUint32(img[0x260:], 0x100000)
	return img
}

// seedVmlinux is a minimal PVH ELF: one PT_LOAD at 16 MiB and a PT_NOTE
// with a Linux note and the Xen PHYS32_ENTRY note.
func seedVmlinux() []byte {
	le := binary.LittleEndian
	notes := []byte{
		6, 0, 0, 0, 4, 0, 0, 0, 6, 0, 0, 0, 'L', 'i', 'n', 'u', 'x', 0, 0, 0, '6', '.', '1', 0,
		4, 0, 0, 0, 4, 0, 0, 0, 18, 0, 0, 0, 'X', 'e', 'n', 0, 0x10, 0, 0, 1,
	}
	img := make([]byte, 64+2*56)
	copy(img, "\x7fELF\x02\x01\x01")
	le.PutUint16(img[18:], 62)
	le.PutUint64(img[32:], 64)
	le.PutUint16(img[54:], 56)
	le.PutUint16(img[56:], 2)
	loadOff := uint64(len(img))
	img = append(img, make([]byte, 64)...)
	noteOff := uint64(len(img))
	img = append(img, notes...)
	le.PutUint32(img[64:], 1)
	le.PutUint64(img[64+8:], loadOff)
	le.PutUint64(img[64+24:], 0x1000000)
	le.PutUint64(img[64+32:], 64)
	le.PutUint64(img[64+40:], 0x1000)
	le.PutUint32(img[120:], 4)
	le.PutUint64(img[120+8:], noteOff)
	le.PutUint64(img[120+32:], uint64(len(notes)))
	return img
}

// FuzzBzImageHeader feeds arbitrary bytes to the bzImage setup-header
// parser and, when it accepts them, to the loader over 8 MiB of RAM.
func FuzzBzImageHeader(f *testing.F) {
	f.Add(seedBzImage())
	f.Add(seedBzImage()[:0x260])
	f.Add([]byte("MZ"))
	mem := make([]byte, 8<<20)
	f.Fuzz(func(t *testing.T, image []byte) {
		h, err := linux.ParseSetupHeader(image)
		if err != nil {
			if !errors.Is(err, linux.ErrBadImage) {
				t.Fatalf("parse error %v does not wrap ErrBadImage", err)
			}
			return
		}
		if h.KernelOffset >= len(image) {
			t.Fatalf("accepted header puts the kernel at %d past %d bytes", h.KernelOffset, len(image))
		}
		_ = h.Payload(image)
		b, err := linux.LoadBzImage(mem, image, linux.Config{Cmdline: "console=ttyS0", Initrd: []byte("x")})
		if err == nil && (b.KernelEnd > uint64(len(mem)) || b.InitrdAddr+b.InitrdSize > uint64(len(mem))) {
			t.Fatalf("loader placed things outside RAM: %+v", b)
		}
	})
}

// FuzzVmlinuxNotes feeds arbitrary bytes to the ELF program-header and PVH
// note parser and, when it accepts them, to the PVH loader over 20 MiB.
func FuzzVmlinuxNotes(f *testing.F) {
	f.Add(seedVmlinux())
	f.Add(seedVmlinux()[:100])
	f.Add([]byte("\x7fELF"))
	mem := make([]byte, 20<<20)
	f.Fuzz(func(t *testing.T, elf []byte) {
		v, err := linux.ParseVmlinux(elf)
		if err != nil {
			if !errors.Is(err, linux.ErrBadImage) {
				t.Fatalf("parse error %v does not wrap ErrBadImage", err)
			}
			return
		}
		for _, s := range v.Segments {
			if s.Offset+s.Filesz > uint64(len(elf)) || s.Filesz > s.Memsz {
				t.Fatalf("accepted segment %+v outside the %d-byte file", s, len(elf))
			}
		}
		b, err := linux.LoadPVH(mem, elf, linux.Config{Cmdline: "console=ttyS0", Initrd: []byte("x")})
		if err == nil && b.KernelEnd > uint64(len(mem)) {
			t.Fatalf("loader placed the kernel outside RAM: %+v", b)
		}
	})
}
