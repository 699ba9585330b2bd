package linux

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"tine/vmm"
	"tine/vmm/serial"
	"tine/vmm/virtio"
)

func sampleMachineImage(t testing.TB) *MachineImage {
	mi := &MachineImage{
		boot:  &Boot{Protocol: ProtocolPVH, Entry: 0x1000000, CmdlineAddr: 0x20000, KernelStart: 1 << 20, KernelEnd: 40 << 20},
		uart:  serial.State{IER: 1, LCR: 3, DLL: 1, MSR: 0xb0, THRI: true, RX: []byte("typed")},
		types: []uint32{4, 3, 2, 19},
	}
	mi.boot.Regs.RIP = 0x1000000
	mi.boot.Sregs.CR0 = 0x11
	for range mi.types {
		mi.states = append(mi.states, virtio.State{Status: 0xf, DriverFeatures: 1 << 32, ConfigGen: 2,
			Queues: []virtio.Queue{{Size: 256, Max: 256, Desc: 0x1000, Avail: 0x2000, Used: 0x3000, Ready: true, LastAvail: 7, UsedIdx: 7}}})
		mi.dev = append(mi.dev, nil)
	}
	mi.dev[3] = []byte("the device's own state")
	return mi
}

// encodeV1 writes mi in the format of images saved before devices had
// state of their own (TINELNX1: no state field after the queues).
func encodeV1(t testing.TB, mi *MachineImage) []byte {
	own := mi.dev
	mi.dev = nil
	defer func() { mi.dev = own }()
	b, err := mi.encodeDevices()
	if err != nil {
		t.Fatal(err)
	}
	// Each device's record ends in a 4-byte zero state size: cut them,
	// last first.
	end := len(b)
	for i := len(mi.types) - 1; i >= 0; i-- {
		b = append(b[:end-4], b[end:]...)
		end -= 4 + 4 + binary.Size(transportWire{}) + 1 + len(mi.states[i].Queues)*binary.Size(queueWire{})
	}
	return append([]byte(devMagicV1), b[len(devMagic):]...)
}

// TestDeviceStateV1: an image written before devices had state of their
// own opens, with none.
func TestDeviceStateV1(t *testing.T) {
	mi := sampleMachineImage(t)
	var got MachineImage
	if err := got.decodeDevices("v1", encodeV1(t, mi)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.states, mi.states) || !reflect.DeepEqual(got.types, mi.types) {
		t.Fatalf("v1 image decoded to %+v", got)
	}
	for i := range got.types {
		if got.devState(i) != nil {
			t.Fatalf("v1 image: device %d has state %q", i, got.devState(i))
		}
	}
}

// TestDeviceStateRoundTrip: boot, UART and virtio state come back equal;
// a cut or grown encoding is refused with the offset.
func TestDeviceStateRoundTrip(t *testing.T) {
	mi := sampleMachineImage(t)
	b, err := mi.encodeDevices()
	if err != nil {
		t.Fatal(err)
	}
	var got MachineImage
	if err := got.decodeDevices("test", b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.boot, mi.boot) || !reflect.DeepEqual(got.uart, mi.uart) ||
		!reflect.DeepEqual(got.types, mi.types) || !reflect.DeepEqual(got.states, mi.states) {
		t.Fatalf("device state changed in a round trip:\n%+v\n%+v", got, mi)
	}
	// A state size past the end of the input is refused before it is
	// allocated.
	huge := bytes.Clone(b)
	binary.LittleEndian.PutUint32(huge[len(huge)-len(mi.dev[3])-4:], virtio.MaxDeviceState)
	for _, bad := range [][]byte{b[:len(b)-1], b[:20], append(bytes.Clone(b), 0), huge} {
		var x MachineImage
		if err := x.decodeDevices("test", bad); err == nil || !strings.Contains(err.Error(), "offset") {
			t.Errorf("damaged device state of %d bytes: %v", len(bad), err)
		}
	}
}

// TestMachineImageDir saves a machine image to a directory and opens it
// again (no KVM needed: nothing runs), and refuses a plain VM's image.
func TestMachineImageDir(t *testing.T) {
	fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, 1<<20)
	unix.Pwrite(fd, []byte("guest RAM"), 4096)
	st := &vmm.State{MemSize: 1 << 20, IRQChip: true, VCPUs: []vmm.VCPUState{{}, {}}}
	img, err := vmm.OpenImage(fd, st, vmm.Config{})
	if err != nil {
		t.Fatal(err)
	}
	mi := sampleMachineImage(t)
	mi.img = img
	defer mi.Close()
	dir := filepath.Join(t.TempDir(), "m")
	if err := mi.SaveDir(dir); err != nil {
		t.Fatal(err)
	}
	got, err := OpenMachineImage(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if mem, cpus := got.Size(); mem != 1<<20 || cpus != 2 {
		t.Fatalf("size %d, %d vCPUs", mem, cpus)
	}
	if !reflect.DeepEqual(got.states, mi.states) || !reflect.DeepEqual(got.uart, mi.uart) {
		t.Fatal("device state differs")
	}
	st.IRQChip = false
	plain, _ := vmm.OpenImage(fd, st, vmm.Config{})
	defer plain.Close()
	pdir := filepath.Join(t.TempDir(), "p")
	if err := plain.SaveDir(pdir, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenMachineImage(pdir); err == nil {
		t.Fatal("a VM image without irqchip opened as a Linux machine")
	}
}

func FuzzDecodeDeviceState(f *testing.F) {
	b, _ := sampleMachineImage(f).encodeDevices()
	f.Add(b)
	f.Add([]byte(devMagic))
	f.Add(encodeV1(f, sampleMachineImage(f)))
	f.Fuzz(func(t *testing.T, data []byte) {
		var mi MachineImage
		if err := mi.decodeDevices("fuzz", data); err != nil {
			return
		}
		b, err := mi.encodeDevices()
		if err != nil {
			t.Fatal(err)
		}
		var again MachineImage
		if err := again.decodeDevices("fuzz", b); err != nil {
			t.Fatalf("re-encoded state does not decode: %v", err)
		}
		if b2, _ := again.encodeDevices(); !bytes.Equal(b, b2) {
			t.Fatal("device state changed in a second round trip")
		}
	})
}
