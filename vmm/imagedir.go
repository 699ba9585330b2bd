package vmm

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"tine/internal/atomicfile"
)

// An image directory holds a sealed image on disk (see docs/vmm.md):
//
//	memory   guest RAM, a sparse file of exactly the RAM size
//	machine  the machine-state file:
//	         "TINEIMG\x01" | u32 version | u64 RAM size
//	         | u32 n | n bytes of State (MarshalBinary)
//	         | u32 m | m bytes of device state (the caller's, opaque here)
//	         | SHA-256 of every byte before it
//
// Little-endian. The directory is written under a temporary name, each
// file and the directory fsynced, then renamed into place and its parent
// fsynced: after a crash it is absent or whole.
const (
	ImageMemoryFile  = "memory"
	ImageMachineFile = "machine"

	imageDirMagic   = "TINEIMG\x01"
	imageDirVersion = 1
	// MaxMachineFile bounds the machine-state file a reader accepts.
	MaxMachineFile = 8 << 20
	// MaxDeviceState bounds the device-state section.
	MaxDeviceState = 1 << 20
)

var errImageDir = errors.New("bad image directory")

// EncodeMachineFile returns the machine-state file for st and devices.
func EncodeMachineFile(st *State, devices []byte) ([]byte, error) {
	sb, err := st.MarshalBinary()
	if err != nil {
		return nil, err
	}
	if len(devices) > MaxDeviceState {
		return nil, fmt.Errorf("vmm: device state of %d bytes, at most %d", len(devices), MaxDeviceState)
	}
	b := make([]byte, 0, len(imageDirMagic)+24+len(sb)+len(devices)+sha256.Size)
	b = append(b, imageDirMagic...)
	b = binary.LittleEndian.AppendUint32(b, imageDirVersion)
	b = binary.LittleEndian.AppendUint64(b, st.MemSize)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(sb)))
	b = append(b, sb...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(devices)))
	b = append(b, devices...)
	sum := sha256.Sum256(b)
	b = append(b, sum[:]...)
	if len(b) > MaxMachineFile {
		return nil, fmt.Errorf("vmm: machine state of %d bytes, at most %d", len(b), MaxMachineFile)
	}
	return b, nil
}

// DecodeMachineFile checks and decodes a machine-state file; name (the
// file's path) is named in errors with the offset of what is wrong. It
// never panics and allocates no more than len(data).
func DecodeMachineFile(name string, data []byte) (*State, []byte, error) {
	fail := func(off int, format string, a ...any) (*State, []byte, error) {
		return nil, nil, fmt.Errorf("vmm: %s: offset %d: %s: %w", name, off, fmt.Sprintf(format, a...), errImageDir)
	}
	if len(data) > MaxMachineFile {
		return fail(0, "%d bytes, more than %d", len(data), MaxMachineFile)
	}
	hdr := len(imageDirMagic) + 16
	if len(data) < hdr+4+sha256.Size || string(data[:len(imageDirMagic)]) != imageDirMagic {
		return fail(0, "not a tine machine-state file")
	}
	body := data[:len(data)-sha256.Size]
	if sum := sha256.Sum256(body); string(sum[:]) != string(data[len(body):]) {
		return fail(len(body), "SHA-256 does not match the contents (the file is damaged)")
	}
	off := len(imageDirMagic)
	if v := binary.LittleEndian.Uint32(body[off:]); v != imageDirVersion {
		return fail(off, "format version %d, this build reads %d", v, imageDirVersion)
	}
	memSize := binary.LittleEndian.Uint64(body[off+4:])
	off += 12
	n := uint64(binary.LittleEndian.Uint32(body[off:]))
	off += 4
	if n > uint64(len(body)-off) {
		return fail(off-4, "machine state of %d bytes runs past the end", n)
	}
	st, err := UnmarshalState(fmt.Sprintf("%s at offset %d", name, off), body[off:off+int(n)])
	if err != nil {
		return nil, nil, err
	}
	if st.MemSize != memSize {
		return fail(len(imageDirMagic)+4, "RAM size %d, the machine state says %d", memSize, st.MemSize)
	}
	off += int(n)
	if len(body)-off < 4 {
		return fail(off, "device state size missing")
	}
	m := uint64(binary.LittleEndian.Uint32(body[off:]))
	off += 4
	if m > MaxDeviceState || m != uint64(len(body)-off) {
		return fail(off-4, "device state of %d bytes, %d left in the file (at most %d)", m, len(body)-off, MaxDeviceState)
	}
	return st, body[off:], nil
}

// SaveDir writes the image to a new image directory dir (which must not
// exist) with devices as its device state. A crash leaves dir absent or
// whole; a temporary sibling left by one is removed by the next SaveDir
// to the same dir.
func (img *Image) SaveDir(dir string, devices []byte) error {
	return img.saveDir(dir, devices, nil)
}

// saveDir is SaveDir with a hook called after each step; an error from
// it stops the write there, as a crash would (nothing is cleaned up).
func (img *Image) saveDir(dir string, devices []byte, step func(string) error) error {
	if img.fd < 0 {
		return errors.New("vmm: a lazily opened snapshot has no RAM to save")
	}
	if step == nil {
		step = func(string) error { return nil }
	}
	fail := func(err error) error { return fmt.Errorf("vmm: save image to %s: %w", dir, err) }
	if _, err := os.Lstat(dir); err == nil {
		return fail(os.ErrExist)
	}
	machine, err := EncodeMachineFile(img.state, devices)
	if err != nil {
		return fail(err)
	}
	tmp := filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return fail(err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fail(err)
	}
	if err := step("mkdir"); err != nil {
		return err
	}
	if err := img.WriteFile(filepath.Join(tmp, ImageMemoryFile)); err != nil { // fsyncs
		return fail(err)
	}
	if err := step("memory"); err != nil {
		return err
	}
	if err := writeFileSync(filepath.Join(tmp, ImageMachineFile), machine); err != nil {
		return fail(err)
	}
	if err := step("machine"); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(tmp); err != nil {
		return fail(err)
	}
	if err := step("sync"); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fail(err)
	}
	if err := step("rename"); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(filepath.Dir(dir)); err != nil {
		return fail(err)
	}
	return nil
}

// OpenImageDir opens an image directory written by SaveDir and returns
// the image (its RAM mapped from the memory file, which must never be
// written while in use) and the device state saved with it. cfg supplies
// what the state does not hold (limits, handlers).
func OpenImageDir(dir string, cfg Config) (*Image, []byte, error) {
	name := filepath.Join(dir, ImageMachineFile)
	f, err := os.Open(name)
	if err != nil {
		return nil, nil, fmt.Errorf("vmm: open image: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxMachineFile+1))
	f.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("vmm: read %s: %w", name, err)
	}
	st, devices, err := DecodeMachineFile(name, data)
	if err != nil {
		return nil, nil, err
	}
	mem := filepath.Join(dir, ImageMemoryFile)
	mf, err := os.Open(mem)
	if err != nil {
		return nil, nil, fmt.Errorf("vmm: open image: %w", err)
	}
	defer mf.Close()
	fi, err := mf.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("vmm: %s: %w", mem, err)
	}
	if !fi.Mode().IsRegular() || uint64(fi.Size()) != st.MemSize {
		return nil, nil, fmt.Errorf("vmm: %s: %d bytes, the machine state in %s says %d of RAM: %w", mem, fi.Size(), name, st.MemSize, errImageDir)
	}
	img, err := OpenImage(int(mf.Fd()), st, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("vmm: %s: %w", mem, err)
	}
	return img, devices, nil
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
