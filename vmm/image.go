package vmm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Image is a sealed guest memory image with the machine state captured at
// the same instant. Its memory is never written again: children map it
// copy-on-write (MAP_PRIVATE) or have its pages copied in on first touch
// (userfaultfd). It stays valid until Close; VMs made from it keep their
// own reference to its memory and outlive it.
type Image struct {
	fd    int // memfd or regular file holding guest RAM
	size  uint64
	state *State
	cfg   Config
	src   PageSource // pages on demand when fd < 0
	refs  atomic.Int32
	once  sync.Once
	fam   *family // family its children join
	depth int     // fork generation of the VM it was sealed from
}

// newImage makes an image holding one reference. Without a family (an
// image loaded or opened rather than sealed), its children start one with
// cfg's limits.
func newImage(fd int, st *State, cfg Config, src PageSource, fam *family, depth int) *Image {
	cfg.MemSize, cfg.VCPUs, cfg.IRQChip = st.MemSize, len(st.VCPUs), st.IRQChip
	if fam == nil {
		fam = newFamily(cfg.Limits)
	}
	img := &Image{fd: fd, size: st.MemSize, state: st, cfg: cfg, src: src, fam: fam, depth: depth}
	img.refs.Store(1)
	return img
}

// State returns the machine state sealed with the image.
func (img *Image) State() *State { return img.state }

// Size returns the size of the image's guest RAM in bytes.
func (img *Image) Size() uint64 { return img.size }

// Fd returns the descriptor holding the image's RAM; it is open until
// Close. Pass it to another process to restore there (see OpenImage).
func (img *Image) Fd() int { return img.fd }

// Close releases the image's descriptor. Children already made keep
// their mappings.
func (img *Image) Close() error {
	img.unref()
	return nil
}

func (img *Image) ref() { img.refs.Add(1) }

func (img *Image) unref() {
	if img.refs.Add(-1) == 0 {
		img.once.Do(func() {
			if img.fd >= 0 {
				unix.Close(img.fd)
			}
		})
	}
}

// OpenImage makes an image from a file (or memfd) holding size bytes of
// guest RAM and the machine state sealed with it, for example in a new
// process. The file must not be written while the image is in use. fd is
// duplicated.
func OpenImage(fd int, st *State, cfg Config) (*Image, error) {
	var stat unix.Stat_t
	if err := unix.Fstat(fd, &stat); err != nil {
		return nil, fmt.Errorf("vmm: stat image fd %d: %w", fd, err)
	}
	if uint64(stat.Size) < st.MemSize {
		return nil, fmt.Errorf("vmm: image file of %d bytes is smaller than guest RAM of %d", stat.Size, st.MemSize)
	}
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vmm: dup image fd %d: %w", fd, err)
	}
	return newImage(nfd, st, cfg, nil, nil, 0), nil
}

// OpenImageFile opens a flat image file written by (*Image).WriteFile.
func OpenImageFile(path string, st *State, cfg Config) (*Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("vmm: open image %s: %w", path, err)
	}
	defer f.Close()
	img, err := OpenImage(int(f.Fd()), st, cfg)
	if err != nil {
		return nil, fmt.Errorf("vmm: image %s: %w", path, err)
	}
	return img, nil
}

// WriteFile writes the image's RAM to a sparse flat file (holes where the
// image has holes) for MAP_PRIVATE restore in later processes.
func (img *Image) WriteFile(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("vmm: create image file %s: %w", path, err)
	}
	if err := f.Truncate(int64(img.size)); err != nil {
		f.Close()
		return fmt.Errorf("vmm: size image file %s: %w", path, err)
	}
	buf := make([]byte, 1<<20)
	err = forEachExtent(img.fd, img.size, func(off, n int64) error {
		for n > 0 {
			m := min(n, int64(len(buf)))
			r, err := unix.Pread(img.fd, buf[:m], off)
			if err != nil {
				return err
			}
			if r == 0 {
				return errors.New("short read")
			}
			// Skip zero pages so the file keeps its holes; write each
			// run of data pages at once.
			run := -1
			for p := 0; ; p += PageSize {
				end := p >= r
				zero := end || p+PageSize <= r && isZeroPage(buf[p:p+PageSize])
				if !zero && run < 0 {
					run = p
				}
				if zero && run >= 0 {
					if _, err := f.WriteAt(buf[run:min(p, r)], off+int64(run)); err != nil {
						return err
					}
					run = -1
				}
				if end {
					break
				}
			}
			off += int64(r)
			n -= int64(r)
		}
		return nil
	})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("vmm: write image file %s: %w", path, err)
	}
	return nil
}

// forEachExtent calls fn for each data extent of fd below size, found
// with SEEK_DATA/SEEK_HOLE.
func forEachExtent(fd int, size uint64, fn func(off, n int64) error) error {
	off := int64(0)
	for off < int64(size) {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA at %d: %w", off, err)
		}
		if d >= int64(size) {
			return nil
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("SEEK_HOLE at %d: %w", d, err)
		}
		h = min(h, int64(size))
		if err := fn(d, h-d); err != nil {
			return err
		}
		off = h
	}
	return nil
}

// Seal captures the state of a stopped (paused, or not running) VM and
// turns its RAM into an immutable image. The VM itself becomes a child of
// the image: its later writes go to private copies, never to the image.
// The first seal of a VM costs no copy; sealing a VM that already runs on
// an image copies its data pages into a new image.
func (vm *VM) Seal() (*Image, error) {
	st, err := vm.CaptureState()
	if err != nil {
		return nil, err
	}
	var fd int
	if vm.image == nil && vm.memfd >= 0 {
		fd = vm.memfd
		vm.memfd = -1
	} else {
		fd, err = vm.copyToMemfd()
		if err != nil {
			return nil, err
		}
	}
	img := newImage(fd, st, vm.cfg, nil, vm.family, vm.depth)
	if err := vm.mapImage(img); err != nil {
		img.Close()
		return nil, err
	}
	return img, nil
}

// copyToMemfd copies the VM's current RAM into a new memfd, visiting only
// pages that can hold data: data extents of the image the VM runs on and
// pages present in the VM's own mapping.
func (vm *VM) copyToMemfd() (int, error) {
	fd, err := unix.MemfdCreate("tine-vm-image", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("vmm: memfd for image: %w", err)
	}
	size := vm.cfg.MemSize
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("vmm: size image memfd: %w", err)
	}
	pages := size / PageSize
	want := make([]uint64, (pages+63)/64)
	if vm.uffd != nil {
		// Reading a page not yet filled fills it from the source.
		for i := range want {
			want[i] = ^uint64(0)
		}
	} else if vm.image != nil {
		forEachExtent(vm.image.fd, size, func(off, n int64) error {
			for p := uint64(off) / PageSize; p < uint64(off+n+PageSize-1)/PageSize && p < pages; p++ {
				want[p/64] |= 1 << (p % 64)
			}
			return nil
		})
	}
	if err := presentPages(vm.mem, want); err != nil {
		unix.Close(fd)
		return -1, err
	}
	for w, bits := range want {
		for bits != 0 {
			b := uint64(trailingZeros(bits))
			bits &^= 1 << b
			p := uint64(w)*64 + b
			page := vm.mem[p*PageSize : (p+1)*PageSize]
			if isZeroPage(page) {
				continue
			}
			if _, err := unix.Pwrite(fd, page, int64(p*PageSize)); err != nil {
				unix.Close(fd)
				return -1, fmt.Errorf("vmm: write page %d of image memfd: %w", p, err)
			}
		}
	}
	return fd, nil
}

// presentPages sets the bit of every page of mem that is present in this
// process (from /proc/self/pagemap).
func presentPages(mem []byte, bits []uint64) error {
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return fmt.Errorf("vmm: open /proc/self/pagemap: %w", err)
	}
	defer f.Close()
	base := uint64(uintptr(unsafePointer(mem)))
	pages := uint64(len(mem)) / PageSize
	buf := make([]byte, 8*4096)
	for p := uint64(0); p < pages; p += 4096 {
		n := min(4096, pages-p)
		if _, err := f.ReadAt(buf[:8*n], int64((base/PageSize+p)*8)); err != nil {
			return fmt.Errorf("vmm: read /proc/self/pagemap: %w", err)
		}
		for i := range n {
			e := binary.LittleEndian.Uint64(buf[8*i:])
			if e&(1<<63|1<<62) != 0 {
				q := p + i
				bits[q/64] |= 1 << (q % 64)
			}
		}
	}
	return nil
}

func trailingZeros(x uint64) int {
	n := 0
	for x&1 == 0 {
		x >>= 1
		n++
	}
	return n
}

func isZeroPage(p []byte) bool {
	for i := 0; i < len(p); i += 8 {
		if binary.NativeEndian.Uint64(p[i:]) != 0 {
			return false
		}
	}
	return true
}

// mapImage maps img copy-on-write over the VM's RAM range; KVM's memory
// slot keeps its address, so nothing else changes.
func (vm *VM) mapImage(img *Image) error {
	if _, err := unix.MmapPtr(img.fd, 0, unsafePointer(vm.mem), uintptr(vm.cfg.MemSize),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_FIXED|unix.MAP_NORESERVE); err != nil {
		return fmt.Errorf("vmm: map image over guest RAM: %w", err)
	}
	img.ref()
	if vm.uffd != nil {
		vm.uffd.close()
		vm.uffd = nil
	}
	if vm.image != nil {
		vm.image.unref()
	}
	vm.image = img
	return nil
}

// Pool keeps empty VMs made ahead of time (vCPUs created, CPUID set, RAM
// range reserved and registered with KVM), so that a fork only maps an
// image and loads registers.
type Pool struct {
	cfg Config
	img *Image // when set, pool VMs have it mapped already
	mu  sync.Mutex
	vms []*VM
}

// NewPool makes a pool of n empty VMs shaped like cfg.
func NewPool(ctx context.Context, cfg Config, n int) (*Pool, error) {
	p := &Pool{cfg: cfg}
	if err := p.Fill(ctx, n); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// NewImagePool makes a pool of n empty VMs that already map img
// MAP_PRIVATE (untouched, so they cost no memory): a MAP_PRIVATE fork of
// img from it only loads the machine state. Replacing a mapping makes KVM
// invalidate the whole memory slot, which costs time in proportion to RAM
// size on shadow-paging hosts; this pool does that ahead of time.
func NewImagePool(ctx context.Context, img *Image, cfg Config, n int) (*Pool, error) {
	cfg.MemSize, cfg.VCPUs, cfg.IRQChip = img.size, len(img.state.VCPUs), img.state.IRQChip
	if img.fd < 0 {
		return nil, errors.New("vmm: a lazily opened snapshot cannot back a pool")
	}
	img.ref()
	p := &Pool{cfg: cfg, img: img}
	if err := p.Fill(ctx, n); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Fill adds VMs until the pool holds n.
func (p *Pool) Fill(ctx context.Context, n int) error {
	for {
		p.mu.Lock()
		have := len(p.vms)
		p.mu.Unlock()
		if have >= n {
			return nil
		}
		vm, err := newVM(ctx, p.cfg)
		if err != nil {
			return err
		}
		if err := vm.warmUp(ctx); err != nil {
			vm.Close()
			return err
		}
		if p.img != nil {
			if err := vm.mapImage(p.img); err != nil {
				vm.Close()
				return err
			}
		}
		p.mu.Lock()
		p.vms = append(p.vms, vm)
		p.mu.Unlock()
	}
}

// Len returns how many VMs the pool holds.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.vms)
}

func (p *Pool) get(ctx context.Context, cfg Config) (*VM, error) {
	if p != nil && p.cfg.MemSize == cfg.MemSize && p.cfg.VCPUs == cfg.VCPUs && p.cfg.IRQChip == cfg.IRQChip && p.cfg.DirtyLog == cfg.DirtyLog {
		p.mu.Lock()
		if n := len(p.vms); n > 0 {
			vm := p.vms[n-1]
			p.vms = p.vms[:n-1]
			p.mu.Unlock()
			vm.cfg = cfg
			vm.reports.max = maxReports(cfg)
			return vm, nil
		}
		p.mu.Unlock()
	}
	return newVM(ctx, cfg)
}

// Close closes the VMs left in the pool.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, vm := range p.vms {
		vm.Close()
	}
	p.vms = nil
	if p.img != nil {
		p.img.unref()
		p.img = nil
	}
}

// ForkMode says how a child gets the image's memory.
type ForkMode int

// Fork modes.
const (
	// ForkMapPrivate maps the image MAP_PRIVATE: the kernel shares its
	// pages and copies one on a child's first write.
	ForkMapPrivate ForkMode = iota
	// ForkUserfault gives the child anonymous memory that a userfaultfd
	// handler fills page by page from the image on first touch.
	ForkUserfault
)

// ForkOptions tune Fork.
type ForkOptions struct {
	// Config of the children; zero means the image's. RAM size, vCPUs and
	// irqchip always come from the image.
	Config *Config
	// Pool supplies empty VMs made ahead; nil makes each child new.
	Pool *Pool
	// Mode is how children get memory.
	Mode ForkMode
	// Source serves pages in ForkUserfault mode; nil serves them from
	// the image.
	Source PageSource
	// IndexInRAX puts each child's index (1..N) in RAX, as the answer to
	// a guest's fork request.
	IndexInRAX bool
}

// Fork makes n children of the image. Each resumes at the sealed
// instruction with copy-on-write memory: it never sees another VM's
// writes made after the seal. Child i (1..n) has Index() == i.
func (img *Image) Fork(ctx context.Context, n int, opts ForkOptions) ([]*VM, error) {
	if n < 0 {
		return nil, fmt.Errorf("vmm: fork of %d children", n)
	}
	if int64(n) > maxVCPUs.Load() {
		return nil, fmt.Errorf("vmm: fork of %d children: the process allows %d vCPUs: %w", n, maxVCPUs.Load(), ErrLimit)
	}
	children := make([]*VM, n)
	errs := make([]error, n)
	// Children are independent: make them on a few goroutines at once.
	workers := min(n, runtime.GOMAXPROCS(0))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				children[i], errs[i] = img.forkOne(ctx, i+1, opts)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range children {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	return children, nil
}

func (img *Image) forkOne(ctx context.Context, index int, opts ForkOptions) (*VM, error) {
	cfg := img.cfg
	if opts.Config != nil {
		cfg = *opts.Config
	}
	cfg.MemSize, cfg.VCPUs, cfg.IRQChip = img.size, len(img.state.VCPUs), img.state.IRQChip
	vm, err := opts.Pool.get(ctx, cfg)
	if err != nil {
		return nil, err
	}
	vm.family, vm.depth = img.fam, img.depth+1
	vm.family.join()
	switch opts.Mode {
	case ForkMapPrivate:
		if img.fd < 0 {
			err = errors.New("vmm: a lazily opened snapshot forks only in userfaultfd mode")
			break
		}
		if vm.image != img {
			err = vm.mapImage(img)
		}
	case ForkUserfault:
		src := opts.Source
		if src == nil {
			src = img.src
		}
		if src == nil {
			src = imageSource{img}
		}
		err = vm.startUserfault(src)
		if err == nil {
			img.ref()
			if vm.image != nil {
				vm.image.unref()
			}
			vm.image = img
		}
	default:
		err = fmt.Errorf("vmm: unknown fork mode %d", opts.Mode)
	}
	if err == nil {
		err = vm.RestoreState(img.state)
	}
	if err == nil && opts.IndexInRAX {
		err = vm.vcpus[0].setRAX(uint64(index))
	}
	if err != nil {
		vm.Close()
		return nil, err
	}
	vm.index = index
	return vm, nil
}

// Fork seals the VM (pausing it if it runs) and makes n children of the
// sealed image; the VM goes on as a child of the image too, so it never
// writes the image its children map. The caller owns the returned image
// and children.
func (vm *VM) Fork(ctx context.Context, n int, opts ForkOptions) (*Image, []*VM, error) {
	vm.Pause()
	defer vm.Resume()
	img, err := vm.Seal()
	if err != nil {
		return nil, nil, err
	}
	children, err := img.Fork(ctx, n, opts)
	if err != nil {
		img.Close()
		return nil, nil, err
	}
	return img, children, nil
}

// warmUp enters a pool VM's vCPU once, running a one-instruction bare
// guest in the placeholder RAM: KVM does its first-entry work for the
// vCPU now instead of in the fork (on PVM that halves the time from a
// fork to the child's first instruction). The placeholder pages it wrote
// are dropped when an image is mapped over them, and the fork loads the
// whole machine state anyway.
func (vm *VM) warmUp(ctx context.Context) error {
	if len(vm.vcpus) != 1 || vm.cfg.IRQChip || vm.cfg.MemSize < bareMinMemSize || vm.cfg.MemSize >= bareMaxGiB<<30-1<<30 {
		return nil
	}
	exit := []byte{0x66, 0xba, byte(PortExit & 0xff), byte(PortExit >> 8), 0x31, 0xc0, 0xef}
	if err := vm.LoadBare(exit); err != nil {
		return fmt.Errorf("vmm: warm up pool VM: %w", err)
	}
	if err := vm.Run(ctx); err != nil {
		return fmt.Errorf("vmm: warm up pool VM: %w", err)
	}
	vm.exited.Store(false)
	vm.exitCode.Store(0)
	return nil
}
