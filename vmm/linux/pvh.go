package linux

import (
	"fmt"
)

// ELF constants the PVH path needs.
const (
	elfHeaderSize   = 64
	elfPhdrSize     = 56
	elfClass64      = 2
	elfData2LSB     = 1
	elfMachineX8664 = 62
	ptLoad          = 1
	ptNote          = 4
	maxPhdrs        = 4096

	// xenElfnotePhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY: the 32-bit
	// physical entry point of a PVH kernel, in a note owned by "Xen".
	xenElfnotePhys32Entry = 18
)

// hvm_start_info layout (version 1), as PVH kernels read it.
const (
	startInfoMagic   = 0x336ec578
	startInfoVersion = 1
	startInfoSize    = 56
	modlistOffset    = 0x40 // from bootInfoAddr
	memmapOffset     = 0x80
	modEntrySize     = 32
	memmapEntrySize  = 24
)

// ELFSegment is one PT_LOAD program header of a vmlinux.
type ELFSegment struct {
	Offset uint64 // in the file
	Paddr  uint64 // guest physical load address
	Filesz uint64
	Memsz  uint64
}

// Vmlinux is what the PVH loader needs from an uncompressed kernel ELF.
type Vmlinux struct {
	// Entry is the XEN_ELFNOTE_PHYS32_ENTRY address.
	Entry    uint32
	Segments []ELFSegment
}

// ParseVmlinux parses a little-endian x86-64 ELF, validates its program
// headers against the file and finds the PVH entry note.
func ParseVmlinux(elf []byte) (*Vmlinux, error) {
	if len(elf) < elfHeaderSize {
		return nil, imageErr("ELF of %d bytes is shorter than its %d-byte header", len(elf), elfHeaderSize)
	}
	if !IsELF(elf) {
		return nil, imageErr("ELF magic at offset 0 is %q", elf[:4])
	}
	if elf[4] != elfClass64 || elf[5] != elfData2LSB {
		return nil, imageErr("ELF class %d / data %d at offset 4: want 64-bit little-endian", elf[4], elf[5])
	}
	if m := le.Uint16(elf[18:]); m != elfMachineX8664 {
		return nil, imageErr("ELF machine %d at offset 18: want x86-64 (%d)", m, elfMachineX8664)
	}
	phoff := le.Uint64(elf[32:])
	phentsize := le.Uint16(elf[54:])
	phnum := le.Uint16(elf[56:])
	if phentsize != elfPhdrSize {
		return nil, imageErr("ELF program header size %d at offset 54: want %d", phentsize, elfPhdrSize)
	}
	if phnum == 0 || phnum > maxPhdrs {
		return nil, imageErr("ELF program header count %d at offset 56 is outside [1, %d]", phnum, maxPhdrs)
	}
	if !inRAM(phoff, uint64(phnum)*elfPhdrSize, uint64(len(elf))) {
		return nil, imageErr("ELF program headers [%#x, +%d×%d) at offset 32 run past the %d-byte file", phoff, phnum, elfPhdrSize, len(elf))
	}
	v := &Vmlinux{}
	found := false
	for i := uint64(0); i < uint64(phnum); i++ {
		at := phoff + i*elfPhdrSize
		ph := elf[at : at+elfPhdrSize]
		typ := le.Uint32(ph)
		off, paddr := le.Uint64(ph[8:]), le.Uint64(ph[24:])
		filesz, memsz := le.Uint64(ph[32:]), le.Uint64(ph[40:])
		switch typ {
		case ptLoad:
			if !inRAM(off, filesz, uint64(len(elf))) {
				return nil, imageErr("ELF PT_LOAD at offset %#x: file range [%#x, +%#x) runs past the %d-byte file", at, off, filesz, len(elf))
			}
			if filesz > memsz {
				return nil, imageErr("ELF PT_LOAD at offset %#x: file size %#x exceeds memory size %#x", at, filesz, memsz)
			}
			if paddr+memsz < paddr {
				return nil, imageErr("ELF PT_LOAD at offset %#x: physical range [%#x, +%#x) overflows", at, paddr, memsz)
			}
			v.Segments = append(v.Segments, ELFSegment{Offset: off, Paddr: paddr, Filesz: filesz, Memsz: memsz})
		case ptNote:
			if !inRAM(off, filesz, uint64(len(elf))) {
				return nil, imageErr("ELF PT_NOTE at offset %#x: range [%#x, +%#x) runs past the %d-byte file", at, off, filesz, len(elf))
			}
			entry, ok, err := findPVHEntry(elf[off:off+filesz], off)
			if err != nil {
				return nil, err
			}
			if ok && !found {
				v.Entry, found = entry, true
			}
		}
	}
	if len(v.Segments) == 0 {
		return nil, imageErr("ELF has no PT_LOAD segment")
	}
	if !found {
		return nil, imageErr("ELF has no XEN_ELFNOTE_PHYS32_ENTRY note: not a PVH kernel (CONFIG_PVH)")
	}
	return v, nil
}

// findPVHEntry walks the notes in one PT_NOTE segment (found at file offset
// base) and returns the PVH entry if the segment has one.
func findPVHEntry(notes []byte, base uint64) (uint32, bool, error) {
	for pos := uint64(0); pos < uint64(len(notes)); {
		if uint64(len(notes))-pos < 12 {
			return 0, false, imageErr("ELF note at offset %#x: %d bytes left, header needs 12", base+pos, uint64(len(notes))-pos)
		}
		namesz := uint64(le.Uint32(notes[pos:]))
		descsz := uint64(le.Uint32(notes[pos+4:]))
		typ := le.Uint32(notes[pos+8:])
		nameAt := pos + 12
		descAt := nameAt + align4(namesz)
		next := descAt + align4(descsz)
		if next > uint64(len(notes)) {
			return 0, false, imageErr("ELF note at offset %#x: name %d + desc %d bytes run past the note segment", base+pos, namesz, descsz)
		}
		name := notes[nameAt : nameAt+namesz]
		if typ == xenElfnotePhys32Entry && string(name) == "Xen\x00" {
			desc := notes[descAt : descAt+descsz]
			var entry uint64
			switch descsz {
			case 4:
				entry = uint64(le.Uint32(desc))
			case 8:
				entry = le.Uint64(desc)
			default:
				return 0, false, imageErr("ELF note at offset %#x: PHYS32_ENTRY descriptor of %d bytes, want 4 or 8", base+pos, descsz)
			}
			if entry > 0xffffffff {
				return 0, false, imageErr("ELF note at offset %#x: PHYS32_ENTRY %#x is above 4 GiB", base+pos, entry)
			}
			return uint32(entry), true, nil
		}
		pos = next
	}
	return 0, false, nil
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// LoadPVH loads an uncompressed vmlinux into mem for the PVH entry.
func LoadPVH(mem, elf []byte, cfg Config) (*Boot, error) {
	if err := checkMem(mem); err != nil {
		return nil, err
	}
	v, err := ParseVmlinux(elf)
	if err != nil {
		return nil, err
	}
	memSize := uint64(len(mem))
	start, end := ^uint64(0), uint64(0)
	for _, s := range v.Segments {
		if s.Paddr < highRAMStart || !inRAM(s.Paddr, s.Memsz, memSize) {
			return nil, fmt.Errorf("vmlinux segment [%#x, +%#x) is outside guest RAM [1 MiB, %#x)", s.Paddr, s.Memsz, memSize)
		}
		start, end = min(start, s.Paddr), max(end, s.Paddr+s.Memsz)
	}
	if uint64(v.Entry) < start || uint64(v.Entry) >= end {
		return nil, imageErr("vmlinux PVH entry %#x lies outside its loaded segments [%#x, %#x)", v.Entry, start, end)
	}

	clear(mem[:highRAMStart])
	for _, s := range v.Segments {
		copy(mem[s.Paddr:s.Paddr+s.Filesz], elf[s.Offset:s.Offset+s.Filesz])
		clear(mem[s.Paddr+s.Filesz : s.Paddr+s.Memsz])
	}
	if err := placeCmdline(mem, cfg.Cmdline, maxCmdline); err != nil {
		return nil, err
	}
	initrdAddr, err := placeInitrd(mem, cfg.Initrd, (end+pageSize-1)&^(pageSize-1), memSize)
	if err != nil {
		return nil, err
	}

	si := mem[bootInfoAddr : bootInfoAddr+pageSize]
	le.PutUint32(si[0:], startInfoMagic)
	le.PutUint32(si[4:], startInfoVersion)
	le.PutUint64(si[24:], cmdlineAddr)
	if len(cfg.Initrd) > 0 {
		le.PutUint32(si[12:], 1) // nr_modules
		le.PutUint64(si[16:], bootInfoAddr+modlistOffset)
		mod := si[modlistOffset:]
		le.PutUint64(mod[0:], initrdAddr)
		le.PutUint64(mod[8:], uint64(len(cfg.Initrd)))
	}
	e820 := memoryMap(memSize)
	le.PutUint64(si[40:], bootInfoAddr+memmapOffset)
	le.PutUint32(si[48:], uint32(len(e820)))
	for i, e := range e820 {
		o := memmapOffset + memmapEntrySize*i
		le.PutUint64(si[o:], e.Addr)
		le.PutUint64(si[o+8:], e.Size)
		le.PutUint32(si[o+16:], e.Type)
	}

	code, data, tss, gdt := writeGDT(mem, false)
	b := &Boot{
		Protocol:    ProtocolPVH,
		KernelStart: start,
		KernelEnd:   end,
		InitrdAddr:  initrdAddr,
		InitrdSize:  uint64(len(cfg.Initrd)),
		CmdlineAddr: cmdlineAddr,
		Entry:       uint64(v.Entry),
	}
	b.Regs = Regs{RIP: b.Entry, RBX: bootInfoAddr, RFLAGS: 2}
	b.Sregs = Sregs{
		CS: code, DS: data, ES: data, FS: data, GS: data, SS: data,
		TR:  tss,
		LDT: Segment{Type: 2, Limit: 0xffff, Unusable: 1},
		GDT: gdt,
		CR0: cr0PE | cr0ET,
	}
	return b, nil
}
