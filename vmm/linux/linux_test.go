package linux

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"tine/vmm/linux/kernels"
)

// debianKernel returns the bzImage and vmlinux fetched by `make kernels`,
// skipping the test when they are absent.
func debianKernel(t *testing.T) (bzImage, vmlinux []byte) {
	t.Helper()
	k, err := kernels.Find()
	if err != nil {
		t.Skipf("Debian cloud kernel not present: %v", err)
	}
	bz, err := os.ReadFile(k.Vmlinuz)
	if err != nil {
		t.Fatal(err)
	}
	elf, err := os.ReadFile(k.Vmlinux)
	if err != nil {
		t.Fatal(err)
	}
	return bz, elf
}

type benchKernel struct{ bz, elf []byte }

func kernelsForBench() (*benchKernel, error) {
	k, err := kernels.Find()
	if err != nil {
		return nil, err
	}
	bz, err := os.ReadFile(k.Vmlinuz)
	if err != nil {
		return nil, err
	}
	elf, err := os.ReadFile(k.Vmlinux)
	if err != nil {
		return nil, err
	}
	return &benchKernel{bz, elf}, nil
}

// walk translates a virtual address through the 4-level page tables at cr3.
func walk(t *testing.T, mem []byte, cr3, va uint64) uint64 {
	t.Helper()
	table := cr3
	for level, shift := 0, uint(39); level < 4; level, shift = level+1, shift-9 {
		e := le.Uint64(mem[table+8*((va>>shift)&511):])
		if e&1 == 0 {
			t.Fatalf("va %#x not present at level %d", va, level)
		}
		if e&(1<<7) != 0 {
			mask := uint64(1)<<shift - 1
			return e&^(mask|0xfff|1<<63)&0x000ffffffffff000 | va&mask
		}
		table = e & 0x000ffffffffff000
	}
	return table | va&0xfff
}

func TestLoadBzImageDebian(t *testing.T) {
	bz, _ := debianKernel(t)
	h, err := ParseSetupHeader(bz)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if !h.Relocatable || h.InitSize == 0 {
		t.Fatalf("unexpected header %+v", h)
	}
	magics := [][]byte{{0x02, 0x21, 0x4c, 0x18}, {0x1f, 0x8b}, {0xfd, '7', 'z', 'X'}, {0x28, 0xb5, 0x2f, 0xfd}}
	p := h.Payload(bz)
	known := false
	for _, m := range magics {
		known = known || bytes.HasPrefix(p, m)
	}
	if !known {
		t.Fatalf("payload starts with % x: no known compression magic", p[:4])
	}

	mem := make([]byte, 512<<20)
	initrd := bytes.Repeat([]byte("initrd!"), 100000)
	cmdline := "console=ttyS0 panic=-1"
	b, err := LoadBzImage(mem, bz, Config{Cmdline: cmdline, Initrd: initrd})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if !bytes.Equal(mem[kernelLoad:kernelLoad+len(bz)-h.KernelOffset], bz[h.KernelOffset:]) {
		t.Fatal("protected-mode kernel not at 1 MiB")
	}
	if b.Entry != 0x100200 || b.Regs.RIP != b.Entry || b.Regs.RSI != bootInfoAddr {
		t.Fatalf("entry %#x rip %#x rsi %#x", b.Entry, b.Regs.RIP, b.Regs.RSI)
	}
	zp := mem[bootInfoAddr:]
	if got := le.Uint32(zp[offHeaderMagic:]); got != headerMagic {
		t.Fatalf("zero page header magic %#x", got)
	}
	if zp[offTypeOfLoader] != loaderUndefined {
		t.Fatalf("type_of_loader %#x", zp[offTypeOfLoader])
	}
	cl := le.Uint32(zp[offCmdLinePtr:])
	if got := string(mem[cl : cl+uint32(len(cmdline))]); got != cmdline || mem[cl+uint32(len(cmdline))] != 0 {
		t.Fatalf("command line %q", got)
	}
	ri, rs := uint64(le.Uint32(zp[offRamdiskImage:])), uint64(le.Uint32(zp[offRamdiskSize:]))
	if rs != uint64(len(initrd)) || !bytes.Equal(mem[ri:ri+rs], initrd) {
		t.Fatalf("initrd at %#x size %#x not found", ri, rs)
	}
	if ri%pageSize != 0 || ri < b.KernelEnd || ri+rs > uint64(h.InitrdAddrMax)+1 || ri+rs > uint64(len(mem)) {
		t.Fatalf("initrd [%#x, +%#x) badly placed (kernel end %#x)", ri, rs, b.KernelEnd)
	}
	if n := zp[bpE820Entries]; n != 3 {
		t.Fatalf("%d e820 entries", n)
	}
	var ramTotal uint64
	for i := 0; i < 3; i++ {
		e := zp[bpE820Table+20*i:]
		if le.Uint32(e[16:]) == e820RAM {
			ramTotal += le.Uint64(e[8:])
		}
	}
	if ramTotal != uint64(len(mem))-(highRAMStart-lowRAMTop) {
		t.Fatalf("e820 RAM total %#x", ramTotal)
	}
	for _, va := range []uint64{0, bootInfoAddr, b.Entry, b.KernelEnd - 1, 3<<30 + 12345} {
		if pa := walk(t, mem, b.Sregs.CR3, va); pa != va {
			t.Fatalf("va %#x maps to %#x, want identity", va, pa)
		}
	}
	if b.Sregs.CS.L != 1 || b.Sregs.EFER&eferLMA == 0 || b.Sregs.CR0&cr0PG == 0 || b.Sregs.CS.Selector != selCode {
		t.Fatalf("not 64-bit entry state: %+v", b.Sregs)
	}
	gdtCode := le.Uint64(mem[b.Sregs.GDT.Base+selCode:])
	if gdtCode != 0x00af9b000000ffff {
		t.Fatalf("GDT code descriptor %#x", gdtCode)
	}
}

func TestLoadPVHDebian(t *testing.T) {
	_, elf := debianKernel(t)
	v, err := ParseVmlinux(elf)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	mem := make([]byte, 512<<20)
	initrd := []byte("070701 not really a cpio")
	b, err := Load(mem, elf, Config{Cmdline: "console=ttyS0", Initrd: initrd})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if b.Protocol != ProtocolPVH || b.Regs.RIP != uint64(v.Entry) || b.Regs.RBX != bootInfoAddr {
		t.Fatalf("boot %+v", b)
	}
	for _, s := range v.Segments {
		if !bytes.Equal(mem[s.Paddr:s.Paddr+s.Filesz], elf[s.Offset:s.Offset+s.Filesz]) {
			t.Fatalf("segment at %#x not loaded", s.Paddr)
		}
	}
	si := mem[bootInfoAddr:]
	if le.Uint32(si) != startInfoMagic || le.Uint32(si[4:]) != 1 || le.Uint32(si[12:]) != 1 {
		t.Fatalf("start info header % x", si[:16])
	}
	mod := mem[le.Uint64(si[16:]):]
	addr, size := le.Uint64(mod), le.Uint64(mod[8:])
	if !bytes.Equal(mem[addr:addr+size], initrd) || addr < b.KernelEnd {
		t.Fatalf("initrd module at %#x size %d", addr, size)
	}
	if cl := le.Uint64(si[24:]); !strings.HasPrefix(string(mem[cl:]), "console=ttyS0\x00") {
		t.Fatal("command line not at cmdline_paddr")
	}
	if n := le.Uint32(si[48:]); n != 3 {
		t.Fatalf("%d memmap entries", n)
	}
	if b.Sregs.CR0&cr0PG != 0 || b.Sregs.CS.DB != 1 || b.Sregs.CS.L != 0 || b.Sregs.EFER != 0 {
		t.Fatalf("not 32-bit flat protected mode: %+v", b.Sregs)
	}
}

// bzHeader builds a minimal valid bzImage: 4 setup sectors and a kernel
// of kernelSize bytes.
func bzHeader(kernelSize int) []byte {
	img := make([]byte, 5*512+kernelSize)
	img[offSetupSects] = 4
	le.PutUint16(img[offBootFlag:], bootFlagMagic)
	img[offJump+1] = byte(setupHeaderMinEnd - offJump - 2)
	le.PutUint32(img[offHeaderMagic:], headerMagic)
	le.PutUint16(img[offVersion:], 0x020f)
	img[offLoadflags] = loadedHigh
	le.PutUint32(img[offInitrdAddrMax:], 0x7fffffff)
	le.PutUint32(img[offKernelAlignment:], 0x200000)
	img[offRelocatable] = 1
	le.PutUint16(img[offXLoadflags:], xlfKernel64)
	le.PutUint32(img[offCmdlineSize:], 64)
	le.PutUint64(img[offPrefAddress:], 0x1000000)
	le.PutUint32(img[offInitSize:], 0x100000)
	return img
}

func TestLoadBzImageRejects(t *testing.T) {
	mod := func(f func(img []byte)) []byte { img := bzHeader(4096); f(img); return img }
	tests := []struct {
		name   string
		image  []byte
		mem    int
		cfg    Config
		bad    bool   // wrapped ErrBadImage expected
		errHas string // substring of the error
	}{
		{"short", make([]byte, 100), 32 << 20, Config{}, true, "shorter than a setup header"},
		{"boot flag", mod(func(b []byte) { b[offBootFlag] = 0 }), 32 << 20, Config{}, true, "boot flag at offset 0x1fe"},
		{"magic", mod(func(b []byte) { b[offHeaderMagic] = 'X' }), 32 << 20, Config{}, true, "header magic"},
		{"old protocol", mod(func(b []byte) { le.PutUint16(b[offVersion:], 0x0206) }), 32 << 20, Config{}, true, "older than 2.12"},
		{"no 64-bit", mod(func(b []byte) { le.PutUint16(b[offXLoadflags:], 0) }), 32 << 20, Config{}, true, "64-bit entry"},
		{"header end", mod(func(b []byte) { b[offJump+1] = 0xff }), 32 << 20, Config{}, true, "setup header end"},
		{"no kernel", mod(func(b []byte) { b[offSetupSects] = 200 }), 32 << 20, Config{}, true, "no protected-mode kernel"},
		{"alignment", mod(func(b []byte) { le.PutUint32(b[offKernelAlignment:], 3) }), 32 << 20, Config{}, true, "kernel_alignment"},
		{"init size", mod(func(b []byte) { le.PutUint32(b[offInitSize:], 16) }), 32 << 20, Config{}, true, "init_size"},
		{"payload", mod(func(b []byte) { le.PutUint32(b[offPayloadLength:], 1<<20) }), 32 << 20, Config{}, true, "payload"},
		{"huge init size", mod(func(b []byte) { le.PutUint32(b[offInitSize:], 0xffffffff) }), 32 << 20, Config{}, false, "needs RAM up to"},
		{"small RAM", bzHeader(4096), 1 << 20, Config{}, false, "below the minimum"},
		{"long cmdline", bzHeader(4096), 32 << 20, Config{Cmdline: strings.Repeat("x", 65)}, false, "exceeds the kernel's limit of 64"},
		{"NUL cmdline", bzHeader(4096), 32 << 20, Config{Cmdline: "a\x00b"}, false, "NUL"},
		{"initrd too big", bzHeader(4096), 32 << 20, Config{Initrd: make([]byte, 16<<20)}, false, "initrd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBzImage(make([]byte, tc.mem), tc.image, tc.cfg)
			if err == nil {
				t.Fatal("loaded, want an error")
			}
			if errors.Is(err, ErrBadImage) != tc.bad || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("error %q (bad image %v), want one containing %q (bad image %v)", err, errors.Is(err, ErrBadImage), tc.errHas, tc.bad)
			}
		})
	}
	if _, err := LoadBzImage(make([]byte, 32<<20), bzHeader(4096), Config{Cmdline: "ok", Initrd: []byte("x")}); err != nil {
		t.Fatalf("minimal image: %v", err)
	}
}

// elfImage builds a minimal PVH vmlinux with one PT_LOAD at 16 MiB and a
// note segment holding notes.
func elfImage(notes []byte) []byte {
	const phoff, nph = 64, 2
	body := bytes.Repeat([]byte{0x90}, 256)
	img := make([]byte, phoff+nph*elfPhdrSize)
	copy(img, "\x7fELF")
	img[4], img[5], img[6] = elfClass64, elfData2LSB, 1
	le.PutUint16(img[18:], elfMachineX8664)
	le.PutUint64(img[32:], phoff)
	le.PutUint16(img[54:], elfPhdrSize)
	le.PutUint16(img[56:], nph)
	loadOff := uint64(len(img))
	img = append(img, body...)
	noteOff := uint64(len(img))
	img = append(img, notes...)
	ph := img[phoff:]
	le.PutUint32(ph, ptLoad)
	le.PutUint64(ph[8:], loadOff)
	le.PutUint64(ph[24:], 0x1000000)
	le.PutUint64(ph[32:], uint64(len(body)))
	le.PutUint64(ph[40:], 0x2000)
	ph = img[phoff+elfPhdrSize:]
	le.PutUint32(ph, ptNote)
	le.PutUint64(ph[8:], noteOff)
	le.PutUint64(ph[32:], uint64(len(notes)))
	return img
}

func note(name string, typ uint32, desc []byte) []byte {
	n := make([]byte, 12)
	le.PutUint32(n, uint32(len(name)))
	le.PutUint32(n[4:], uint32(len(desc)))
	le.PutUint32(n[8:], typ)
	n = append(n, name...)
	for len(n)%4 != 0 {
		n = append(n, 0)
	}
	n = append(n, desc...)
	for len(n)%4 != 0 {
		n = append(n, 0)
	}
	return n
}

func TestParseVmlinux(t *testing.T) {
	entry := func(v uint32) []byte { b := make([]byte, 4); le.PutUint32(b, v); return b }
	good := append(note("Linux\x00", 6, []byte("6.1\x00")), note("Xen\x00", xenElfnotePhys32Entry, entry(0x1000010))...)
	tests := []struct {
		name   string
		image  []byte
		entry  uint32
		errHas string
	}{
		{"good", elfImage(good), 0x1000010, ""},
		{"8-byte entry", elfImage(note("Xen\x00", xenElfnotePhys32Entry, append(entry(0x1000020), 0, 0, 0, 0))), 0x1000020, ""},
		{"no note", elfImage(note("Linux\x00", 6, []byte("x"))), 0, "no XEN_ELFNOTE_PHYS32_ENTRY"},
		{"wrong owner", elfImage(note("Xyz\x00", xenElfnotePhys32Entry, entry(1))), 0, "no XEN_ELFNOTE_PHYS32_ENTRY"},
		{"bad desc size", elfImage(note("Xen\x00", xenElfnotePhys32Entry, []byte{1, 2})), 0, "descriptor of 2 bytes"},
		{"entry above 4G", elfImage(note("Xen\x00", xenElfnotePhys32Entry, []byte{0, 0, 0, 0, 1, 0, 0, 0})), 0, "above 4 GiB"},
		{"truncated note", elfImage([]byte{4, 0, 0, 0, 0xff, 0, 0, 0, 18, 0, 0, 0, 'X'}), 0, "run past the note segment"},
		{"short note header", elfImage([]byte{1, 2, 3}), 0, "header needs 12"},
		{"short", []byte("\x7fELF"), 0, "shorter than"},
		{"class", func() []byte { b := elfImage(good); b[4] = 1; return b }(), 0, "64-bit little-endian"},
		{"machine", func() []byte { b := elfImage(good); b[18] = 3; return b }(), 0, "machine"},
		{"phdrs past end", func() []byte { b := elfImage(good); le.PutUint64(b[32:], 1<<62); return b }(), 0, "program headers"},
		{"load past end", func() []byte { b := elfImage(good); le.PutUint64(b[64+32:], 1<<40); return b }(), 0, "PT_LOAD"},
		{"filesz > memsz", func() []byte { b := elfImage(good); le.PutUint64(b[64+40:], 1); return b }(), 0, "exceeds memory size"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := ParseVmlinux(tc.image)
			if tc.errHas != "" {
				if err == nil || !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %v, want one containing %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.Entry != tc.entry {
				t.Fatalf("entry %#x, want %#x", v.Entry, tc.entry)
			}
		})
	}
}

func TestLoadPVHRejects(t *testing.T) {
	entry := make([]byte, 4)
	le.PutUint32(entry, 0x1000010)
	img := elfImage(note("Xen\x00", xenElfnotePhys32Entry, entry))
	if _, err := LoadPVH(make([]byte, 16<<20), img, Config{}); err == nil || !strings.Contains(err.Error(), "outside guest RAM") {
		t.Fatalf("16 MiB RAM: error %v, want segment outside guest RAM", err)
	}
	le.PutUint32(entry, 0x3000000)
	img = elfImage(note("Xen\x00", xenElfnotePhys32Entry, entry))
	if _, err := LoadPVH(make([]byte, 64<<20), img, Config{}); err == nil || !strings.Contains(err.Error(), "outside its loaded segments") {
		t.Fatalf("entry outside segments: error %v", err)
	}
}
