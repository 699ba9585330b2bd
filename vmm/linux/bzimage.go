package linux

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

var le = binary.LittleEndian

// Offsets of setup header fields inside a bzImage (and inside boot_params,
// which embeds the header at the same offset).
const (
	offSetupSects      = 0x1f1
	offBootFlag        = 0x1fe
	offJump            = 0x200
	offHeaderMagic     = 0x202
	offVersion         = 0x206
	offTypeOfLoader    = 0x210
	offLoadflags       = 0x211
	offRamdiskImage    = 0x218
	offRamdiskSize     = 0x21c
	offCmdLinePtr      = 0x228
	offInitrdAddrMax   = 0x22c
	offKernelAlignment = 0x230
	offRelocatable     = 0x234
	offXLoadflags      = 0x236
	offCmdlineSize     = 0x238
	offPayloadOffset   = 0x248
	offPayloadLength   = 0x24c
	offPrefAddress     = 0x258
	offInitSize        = 0x260
	setupHeaderMinEnd  = 0x264 + 4 // through init_size (protocol 2.10+)
	bootParamsHdrLimit = 0x290     // boot_params field after the header
)

// boot_params fields outside the setup header.
const (
	bpExtRamdiskImage = 0x0c0
	bpExtRamdiskSize  = 0x0c4
	bpExtCmdLinePtr   = 0x0c8
	bpE820Entries     = 0x1e8
	bpE820Table       = 0x2d0
	bpE820Max         = 128
	bpVidMode         = 0x1fa
	bpACPIRSDPAddr    = 0x070
)

const (
	bootFlagMagic   = 0xaa55
	headerMagic     = 0x53726448 // "HdrS"
	minProtocol     = 0x020c     // 2.12: xloadflags and the 64-bit entry
	loadedHigh      = 1 << 0
	xlfKernel64     = 1 << 0
	entry64Offset   = 0x200
	loaderUndefined = 0xff
)

// SetupHeader is the part of a bzImage's setup header the loader uses,
// parsed and validated by ParseSetupHeader.
type SetupHeader struct {
	Version         uint16 // boot protocol version, e.g. 0x020f
	SetupSects      int    // 512-byte sectors of real-mode setup after the boot sector
	Loadflags       uint8
	XLoadflags      uint16
	InitrdAddrMax   uint32 // highest address the initrd may occupy
	KernelAlignment uint32
	Relocatable     bool
	CmdlineSize     uint32 // longest command line, without the NUL
	PayloadOffset   uint32 // compressed payload, from the protected-mode start
	PayloadLength   uint32
	PrefAddress     uint64
	InitSize        uint32 // bytes the kernel needs from its run address
	// HeaderEnd is the offset just past the setup header (0x202 plus the
	// byte at 0x201).
	HeaderEnd int
	// KernelOffset is where the protected-mode kernel starts in the image.
	KernelOffset int
}

// ParseSetupHeader parses and validates the setup header of a bzImage.
// It accepts only kernels that speak boot protocol 2.12 or later and have
// a 64-bit entry point.
func ParseSetupHeader(image []byte) (*SetupHeader, error) {
	if len(image) < setupHeaderMinEnd {
		return nil, imageErr("bzImage of %d bytes is shorter than a setup header (%d)", len(image), setupHeaderMinEnd)
	}
	if v := le.Uint16(image[offBootFlag:]); v != bootFlagMagic {
		return nil, imageErr("bzImage boot flag at offset %#x is %#04x, want %#04x", offBootFlag, v, bootFlagMagic)
	}
	if v := le.Uint32(image[offHeaderMagic:]); v != headerMagic {
		return nil, imageErr("bzImage header magic at offset %#x is %#08x, want \"HdrS\"", offHeaderMagic, v)
	}
	h := &SetupHeader{
		Version:         le.Uint16(image[offVersion:]),
		SetupSects:      int(image[offSetupSects]),
		Loadflags:       image[offLoadflags],
		XLoadflags:      le.Uint16(image[offXLoadflags:]),
		InitrdAddrMax:   le.Uint32(image[offInitrdAddrMax:]),
		KernelAlignment: le.Uint32(image[offKernelAlignment:]),
		Relocatable:     image[offRelocatable] != 0,
		CmdlineSize:     le.Uint32(image[offCmdlineSize:]),
		PayloadOffset:   le.Uint32(image[offPayloadOffset:]),
		PayloadLength:   le.Uint32(image[offPayloadLength:]),
		PrefAddress:     le.Uint64(image[offPrefAddress:]),
		InitSize:        le.Uint32(image[offInitSize:]),
		HeaderEnd:       offJump + 2 + int(image[offJump+1]),
	}
	if h.Version < minProtocol {
		return nil, imageErr("bzImage boot protocol %d.%02d at offset %#x is older than 2.12", h.Version>>8, h.Version&0xff, offVersion)
	}
	if h.XLoadflags&xlfKernel64 == 0 {
		return nil, imageErr("bzImage xloadflags %#x at offset %#x lack a 64-bit entry point", h.XLoadflags, offXLoadflags)
	}
	if h.Loadflags&loadedHigh == 0 {
		return nil, imageErr("bzImage loadflags %#x at offset %#x: not a high-loaded kernel", h.Loadflags, offLoadflags)
	}
	if h.HeaderEnd < setupHeaderMinEnd || h.HeaderEnd > bootParamsHdrLimit {
		return nil, imageErr("bzImage setup header end %#x (from the byte at offset %#x) is outside [%#x, %#x]", h.HeaderEnd, offJump+1, setupHeaderMinEnd, bootParamsHdrLimit)
	}
	if h.SetupSects == 0 {
		h.SetupSects = 4
	}
	h.KernelOffset = (h.SetupSects + 1) * 512
	if h.KernelOffset < h.HeaderEnd {
		return nil, imageErr("bzImage setup of %d sectors (offset %#x) ends inside its own header", h.SetupSects, offSetupSects)
	}
	if h.KernelOffset >= len(image) {
		return nil, imageErr("bzImage setup of %d sectors (offset %#x) leaves no protected-mode kernel in %d bytes", h.SetupSects, offSetupSects, len(image))
	}
	if a := h.KernelAlignment; h.Relocatable && (a < pageSize || a > 1<<30 || bits.OnesCount32(a) != 1) {
		return nil, imageErr("bzImage kernel_alignment %#x at offset %#x is not a power of two in [4 KiB, 1 GiB]", a, offKernelAlignment)
	}
	kernelSize := uint64(len(image) - h.KernelOffset)
	if uint64(h.InitSize) < kernelSize {
		return nil, imageErr("bzImage init_size %#x at offset %#x is smaller than the %#x-byte kernel", h.InitSize, offInitSize, kernelSize)
	}
	if end := uint64(h.PayloadOffset) + uint64(h.PayloadLength); h.PayloadLength != 0 && end > kernelSize {
		return nil, imageErr("bzImage payload [%#x, +%#x) at offset %#x runs past the %#x-byte kernel", h.PayloadOffset, h.PayloadLength, offPayloadOffset, kernelSize)
	}
	if h.CmdlineSize == 0 {
		h.CmdlineSize = 255
	}
	return h, nil
}

// runAddress is where the kernel decompresses itself and runs when its
// protected-mode part is loaded at loadAddr.
func (h *SetupHeader) runAddress(loadAddr uint64) uint64 {
	if !h.Relocatable {
		return h.PrefAddress
	}
	a := uint64(h.KernelAlignment)
	run := (loadAddr + a - 1) &^ (a - 1)
	if run < h.PrefAddress {
		run = h.PrefAddress
	}
	return run
}

// Payload returns the compressed kernel payload inside image, as described
// by the header (nil if the header names none).
func (h *SetupHeader) Payload(image []byte) []byte {
	if h.PayloadLength == 0 {
		return nil
	}
	start := h.KernelOffset + int(h.PayloadOffset)
	return image[start : start+int(h.PayloadLength)]
}

// LoadBzImage loads a bzImage into mem through the 64-bit boot protocol.
func LoadBzImage(mem, image []byte, cfg Config) (*Boot, error) {
	if err := checkMem(mem); err != nil {
		return nil, err
	}
	h, err := ParseSetupHeader(image)
	if err != nil {
		return nil, err
	}
	memSize := uint64(len(mem))
	kernel := image[h.KernelOffset:]
	if !inRAM(kernelLoad, uint64(len(kernel)), memSize) {
		return nil, fmt.Errorf("bzImage kernel of %d bytes at %#x does not fit in %d bytes of RAM", len(kernel), kernelLoad, memSize)
	}
	run := h.runAddress(kernelLoad)
	if run < highRAMStart {
		return nil, imageErr("bzImage run address %#x (pref_address at offset %#x) is below 1 MiB", run, offPrefAddress)
	}
	kernelEnd := run + uint64(h.InitSize)
	if !inRAM(run, uint64(h.InitSize), memSize) {
		return nil, fmt.Errorf("bzImage needs RAM up to %#x (run address %#x + init_size %#x), guest has %#x", kernelEnd, run, h.InitSize, memSize)
	}
	if e := kernelLoad + uint64(len(kernel)); e > kernelEnd {
		kernelEnd = e
	}

	clear(mem[:highRAMStart])
	copy(mem[kernelLoad:], kernel)
	if err := placeCmdline(mem, cfg.Cmdline, uint64(h.CmdlineSize)+1); err != nil {
		return nil, err
	}
	initrdAddr, err := placeInitrd(mem, cfg.Initrd, kernelEnd, uint64(h.InitrdAddrMax)+1)
	if err != nil {
		return nil, err
	}

	zp := mem[bootInfoAddr : bootInfoAddr+pageSize]
	copy(zp[offSetupSects:], image[offSetupSects:h.HeaderEnd])
	zp[offTypeOfLoader] = loaderUndefined
	le.PutUint16(zp[bpVidMode:], 0xffff)
	le.PutUint32(zp[offCmdLinePtr:], cmdlineAddr)
	le.PutUint32(zp[bpExtCmdLinePtr:], 0)
	le.PutUint32(zp[offRamdiskImage:], uint32(initrdAddr))
	le.PutUint32(zp[offRamdiskSize:], uint32(len(cfg.Initrd)))
	le.PutUint32(zp[bpExtRamdiskImage:], uint32(initrdAddr>>32))
	le.PutUint32(zp[bpExtRamdiskSize:], uint32(uint64(len(cfg.Initrd))>>32))
	e820 := memoryMap(memSize)
	zp[bpE820Entries] = byte(len(e820))
	for i, e := range e820 {
		o := bpE820Table + 20*i
		le.PutUint64(zp[o:], e.Addr)
		le.PutUint64(zp[o+8:], e.Size)
		le.PutUint32(zp[o+16:], e.Type)
	}

	cr3 := writeIdentityPageTables(mem)
	code, data, tss, gdt := writeGDT(mem, true)
	b := &Boot{
		Protocol:    ProtocolBzImage,
		KernelStart: kernelLoad,
		KernelEnd:   kernelEnd,
		InitrdAddr:  initrdAddr,
		InitrdSize:  uint64(len(cfg.Initrd)),
		CmdlineAddr: cmdlineAddr,
		Entry:       kernelLoad + entry64Offset,
	}
	b.Regs = Regs{RIP: b.Entry, RSI: bootInfoAddr, RSP: stackTop, RFLAGS: 2}
	b.Sregs = Sregs{
		CS: code, DS: data, ES: data, FS: data, GS: data, SS: data,
		TR:   tss,
		LDT:  Segment{Type: 2, Limit: 0xffff, Unusable: 1},
		GDT:  gdt,
		CR0:  cr0PE | cr0ET | cr0NE | cr0PG,
		CR3:  cr3,
		CR4:  cr4PAE,
		EFER: eferLME | eferLMA,
	}
	return b, nil
}

// Control register and EFER bits.
const (
	cr0PE   = 1 << 0
	cr0ET   = 1 << 4
	cr0NE   = 1 << 5
	cr0PG   = 1 << 31
	cr4PAE  = 1 << 5
	eferLME = 1 << 8
	eferLMA = 1 << 10
)
