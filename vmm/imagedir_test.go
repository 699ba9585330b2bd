package vmm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// memImage makes an image without KVM: a memfd of size bytes with page i
// (for i in pages) holding the byte i+1, and st's machine state.
func memImage(t testing.TB, size uint64, pages []uint64) *Image {
	t.Helper()
	fd, err := unix.MemfdCreate("test-image", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		if _, err := unix.Pwrite(fd, bytes.Repeat([]byte{byte(p + 1)}, PageSize), int64(p*PageSize)); err != nil {
			t.Fatal(err)
		}
	}
	st := sampleState()
	st.MemSize = size
	img := newImage(fd, st, Config{}, nil, nil, 0)
	t.Cleanup(func() { img.Close() })
	return img
}

// checkImageDir opens dir and checks it holds img's RAM, state and devices.
func checkImageDir(t *testing.T, dir string, img *Image, devices []byte) {
	t.Helper()
	got, dev, err := OpenImageDir(dir, Config{})
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer got.Close()
	if !bytes.Equal(dev, devices) {
		t.Fatalf("device state %q, want %q", dev, devices)
	}
	a, _ := got.State().MarshalBinary()
	b, _ := img.State().MarshalBinary()
	if !bytes.Equal(a, b) {
		t.Fatal("machine state differs after a round trip through the directory")
	}
	for off := uint64(0); off < img.Size(); off += PageSize {
		x, y := make([]byte, PageSize), make([]byte, PageSize)
		unix.Pread(img.fd, x, int64(off))
		unix.Pread(got.fd, y, int64(off))
		if !bytes.Equal(x, y) {
			t.Fatalf("page at %#x differs", off)
		}
	}
}

// TestImageDirRoundTrip: a saved directory opens to the same RAM, state
// and device state, keeps its holes, and is not overwritten.
func TestImageDirRoundTrip(t *testing.T) {
	img := memImage(t, 4<<20, []uint64{0, 3, 1000, 1023})
	dir := filepath.Join(t.TempDir(), "img")
	if err := img.SaveDir(dir, []byte("devices")); err != nil {
		t.Fatal(err)
	}
	checkImageDir(t, dir, img, []byte("devices"))
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, ImageMemoryFile), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 64<<10 {
		t.Errorf("memory file uses %d bytes for 4 data pages: holes were not kept", st.Blocks*512)
	}
	if err := img.SaveDir(dir, nil); !errors.Is(err, os.ErrExist) {
		t.Fatalf("save over an existing directory: %v", err)
	}
}

// TestImageDirCrash stops a save after each of its steps, as a crash
// would: the directory is then absent or opens whole, and the next save
// to it succeeds.
func TestImageDirCrash(t *testing.T) {
	img := memImage(t, 2<<20, []uint64{1, 200})
	stop := errors.New("crash")
	for _, at := range []string{"mkdir", "memory", "machine", "sync", "rename"} {
		t.Run(at, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "img")
			err := img.saveDir(dir, []byte("d"), func(s string) error {
				if s == at {
					return stop
				}
				return nil
			})
			if err != stop {
				t.Fatalf("save stopped at %s: %v", at, err)
			}
			if _, err := os.Stat(dir); err == nil {
				checkImageDir(t, dir, img, []byte("d"))
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			} else {
				if _, _, err := OpenImageDir(dir, Config{}); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("open of an absent directory: %v", err)
				}
				if err := img.SaveDir(dir, []byte("d")); err != nil {
					t.Fatalf("save after a crash at %s: %v", at, err)
				}
				checkImageDir(t, dir, img, []byte("d"))
			}
		})
	}
}

// TestImageDirDamaged: a machine file with any byte changed, cut short
// or grown, or a memory file of the wrong size, is refused with the file
// named.
func TestImageDirDamaged(t *testing.T) {
	img := memImage(t, 1<<20, []uint64{2})
	dir := filepath.Join(t.TempDir(), "img")
	if err := img.SaveDir(dir, []byte("devices")); err != nil {
		t.Fatal(err)
	}
	mf := filepath.Join(dir, ImageMachineFile)
	good, err := os.ReadFile(mf)
	if err != nil {
		t.Fatal(err)
	}
	try := func(what string, b []byte) {
		t.Helper()
		if err := os.WriteFile(mf, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := OpenImageDir(dir, Config{})
		if err == nil {
			t.Fatalf("%s: damaged machine file opened", what)
		}
		if !strings.Contains(err.Error(), mf) || !strings.Contains(err.Error(), "offset") {
			t.Fatalf("%s: error names no file and offset: %v", what, err)
		}
	}
	// Every byte flipped is refused by the decoder; a few go through
	// the files too.
	for i := range good {
		b := bytes.Clone(good)
		b[i] ^= 0x40
		if _, _, err := DecodeMachineFile(mf, b); err == nil {
			t.Fatalf("byte %d flipped: decoded", i)
		}
		if i < 32 || i%997 == 0 || i >= len(good)-4 {
			try(fmt.Sprintf("byte %d flipped", i), b)
		}
	}
	for _, n := range []int{0, 8, len(good) / 2, len(good) - 1} {
		try(fmt.Sprintf("cut to %d bytes", n), good[:n])
	}
	try("grown", append(bytes.Clone(good), 0))
	os.WriteFile(mf, good, 0o600)
	mem := filepath.Join(dir, ImageMemoryFile)
	if err := os.Truncate(mem, 1<<19); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenImageDir(dir, Config{}); err == nil || !strings.Contains(err.Error(), mem) {
		t.Fatalf("short memory file: %v", err)
	}
}

// TestDecodeMachineFileBounds: counts that claim more than the file
// holds, or a version this build does not read, are refused even with a
// correct checksum.
func TestDecodeMachineFileBounds(t *testing.T) {
	good, err := EncodeMachineFile(sampleState(), []byte("dev"))
	if err != nil {
		t.Fatal(err)
	}
	reseal := func(body []byte) []byte {
		sum := sha256.Sum256(body)
		return append(body, sum[:]...)
	}
	body := bytes.Clone(good[:len(good)-32])
	for _, tc := range []struct {
		name string
		off  int
		val  byte
	}{{"version", 8, 2}, {"state length", 23, 0x7f}, {"device length", len(body) - 7, 0x7f}, {"RAM size", 13, 0x55}} {
		b := bytes.Clone(body)
		b[tc.off] = tc.val
		if _, _, err := DecodeMachineFile("f", reseal(b)); err == nil {
			t.Errorf("%s changed and resealed: decoded", tc.name)
		}
	}
	if _, _, err := DecodeMachineFile("f", reseal(bytes.Clone(body))); err != nil {
		t.Fatalf("resealed good file: %v", err)
	}
}

func FuzzDecodeMachineFile(f *testing.F) {
	good, _ := EncodeMachineFile(sampleState(), []byte("devices"))
	f.Add(good)
	f.Add(good[:40])
	f.Add([]byte(imageDirMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, dev, err := DecodeMachineFile("fuzz", data)
		if err != nil {
			return
		}
		b, err := EncodeMachineFile(st, dev)
		if err != nil {
			t.Fatal(err)
		}
		st2, dev2, err := DecodeMachineFile("fuzz", b)
		if err != nil {
			t.Fatalf("re-encoded file does not decode: %v", err)
		}
		if !bytes.Equal(dev, dev2) {
			t.Fatal("device state changed in a round trip")
		}
		if b2, _ := EncodeMachineFile(st2, dev2); !bytes.Equal(b, b2) {
			t.Fatal("machine file changed in a second round trip")
		}
	})
}

// bigGuest writes every page above 16 MiB, keeps a running value in a
// register across a snapshot request, and sums what it wrote at the end.
const bigGuest = `
void main(u64 memsize) {
	volatile u64 *a = (u64 *)0x1000000;
	u64 pages = (memsize - 0x1000000) / 4096;
	u64 x = 88172645463325252UL;
	for (u64 i = 0; i < pages; i++) a[i * 512] = i ^ x;
	for (u64 i = 0; i < 20000; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; a[(x % pages) * 512] += x; }
	snapshot();
	for (u64 i = 0; i < 20000; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; a[(x % pages) * 512] ^= x; }
	u64 sum = 0;
	for (u64 i = 0; i < pages; i++) sum += a[i * 512] * (i + 1);
	report((u32)sum);
	report((u32)(sum >> 32));
	exit(3);
}`

// TestImageDirBareGuest saves a 256 MiB bare guest to an image directory
// at its snapshot request and runs on; a fresh process opens the
// directory and clones it, and the clone must finish with the result of
// the uninterrupted run (its registers and memory carried over). It logs
// the save and open+clone times.
func TestImageDirBareGuest(t *testing.T) {
	prog := buildGuest(t, bigGuest) // before the skip without KVM (see buildGuest)
	dir := filepath.Join(t.TempDir(), "img")
	var saved time.Duration
	onRequest := func(ctx context.Context, vm *VM, req Request) (uint64, error) {
		start := time.Now()
		img, err := vm.Seal()
		if err != nil {
			return 0, err
		}
		defer img.Close()
		err = img.SaveDir(dir, []byte("bare"))
		saved = time.Since(start)
		return 0, err
	}
	vm := newBare(t, 256<<20, prog, Config{OnRequest: onRequest})
	runBounded(t, vm)
	want := vm.Reports()
	if len(want) != 2 || vm.ExitCode() != 3 {
		t.Fatalf("uninterrupted run reported %v, exit %d", want, vm.ExitCode())
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(dir, ImageMemoryFile), &st)
	t.Logf("seal + save of a 256 MiB guest (%d MiB of data): %v", st.Blocks*512>>20, saved)
	out := restoreInProcess(t, dir+",,dir")
	wantLine := fmt.Sprintf("RESULT %d %d exit 3", want[0], want[1])
	if !strings.Contains(out, wantLine) {
		t.Fatalf("restore process did not print %q:\n%s", wantLine, out)
	}
	t.Logf("restore process: %s", strings.TrimSpace(out))
}

// BenchmarkImageDir saves a 256 MiB image whose every page holds data to
// an image directory and opens it again (no KVM: the clone itself is in
// TestImageDirBareGuest).
func BenchmarkImageDir(b *testing.B) {
	pages := make([]uint64, (256<<20)/PageSize)
	for i := range pages {
		pages[i] = uint64(i)
	}
	img := memImage(b, 256<<20, pages)
	for i := 0; i < b.N; i++ {
		dir := filepath.Join(b.TempDir(), "img")
		start := time.Now()
		if err := img.SaveDir(dir, nil); err != nil {
			b.Fatal(err)
		}
		saved := time.Since(start)
		start = time.Now()
		got, _, err := OpenImageDir(dir, Config{})
		if err != nil {
			b.Fatal(err)
		}
		opened := time.Since(start)
		got.Close()
		b.ReportMetric(float64(saved.Milliseconds()), "save-ms")
		b.ReportMetric(float64(opened.Microseconds()), "open-us")
	}
}
