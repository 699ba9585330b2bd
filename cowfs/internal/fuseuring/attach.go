// Package fuseuring serves a go-fuse connection's requests over
// FUSE-over-io_uring (Linux 6.14+, with the fuse module's enable_uring
// parameter set).
//
// The kernel puts each request on the queue of the CPU its caller runs
// on. For each connection this package keeps one thread per CPU, bound
// to that CPU, with one io_uring holding the connection's ring entries
// for that CPU's queue. A request is then answered on the CPU that made
// it: no wake-up of another CPU on the way in or out, which on a virtual
// machine is most of a FUSE round trip (ADR 0181).
//
// go-fuse's own server keeps the connection's /dev/fuse descriptor: it
// answers INIT, the requests the kernel sends there before the rings are
// ready, FORGET and INTERRUPT, and it sends notifications. The rings
// answer every other request through a fuse.ProtocolServer of the same
// file system.
package fuseuring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// enableParam is the fuse module's switch for io_uring connections.
const enableParam = "/sys/module/fuse/parameters/enable_uring"

// Enabled reports whether this kernel offers FUSE over io_uring to new
// connections.
func Enabled() bool {
	b, err := os.ReadFile(enableParam)
	return err == nil && strings.TrimSpace(string(b)) == "Y"
}

// SetEnabled turns the kernel's offer of FUSE over io_uring on or off
// for new connections (root only), and returns the previous setting.
func SetEnabled(on bool) (was bool, err error) {
	was = Enabled()
	v := "N"
	if on {
		v = "Y"
	}
	return was, os.WriteFile(enableParam, []byte(v), 0)
}

var probe struct {
	once sync.Once
	err  error
}

// Prepare checks that this process can make rings (a seccomp filter or
// a sysctl may forbid io_uring) and may start one more connection's
// threads. A mount offers io_uring (fuse.CAP_OVER_IO_URING) only when
// Prepare succeeded: once the kernel agrees to it, no request of the
// mount is answered until Attach registered the rings.
func Prepare() error {
	probe.once.Do(func() {
		r, err := newRing(1)
		if err == nil {
			r.close()
		}
		probe.err = err
	})
	if probe.err != nil {
		return probe.err
	}
	if threads.Load()+int64(runtime.NumCPU()) > maxThreads {
		return fmt.Errorf("more than %d FUSE ring threads", maxThreads)
	}
	return nil
}

// InitHook wraps a file system so that Inited tells when go-fuse has
// answered the connection's INIT.
type InitHook struct {
	fuse.RawFileSystem
	inited chan struct{}
	once   sync.Once
}

// NewInitHook wraps fs.
func NewInitHook(fs fuse.RawFileSystem) *InitHook {
	return &InitHook{RawFileSystem: fs, inited: make(chan struct{})}
}

// Init is called by go-fuse once INIT is answered.
func (h *InitHook) Init(s *fuse.Server) {
	h.RawFileSystem.Init(s)
	h.once.Do(func() { close(h.inited) })
}

// Inited is closed once INIT is answered.
func (h *InitHook) Inited() <-chan struct{} { return h.inited }

// ErrNotOffered is returned by Attach when the connection did not agree
// to io_uring; it goes on over /dev/fuse.
var ErrNotOffered = errors.New("the kernel did not offer FUSE over io_uring")

// Attach registers ring entries for srv's connection on every CPU's
// queue, so that the kernel sends its requests over the rings from then
// on. fs and opts must be those srv was made with, and srv must have
// answered INIT (InitHook). On error the connection goes on over
// /dev/fuse.
func Attach(srv *fuse.Server, fs fuse.RawFileSystem, opts *fuse.MountOptions) (*Conn, error) {
	settings := srv.KernelSettings()
	if settings.Flags64()&fuse.CAP_OVER_IO_URING == 0 {
		return nil, ErrNotOffered
	}
	qs, err := queues()
	if err != nil {
		return nil, err
	}
	fd, err := deviceFD(srv)
	if err != nil {
		return nil, err
	}
	c := &Conn{fd: fd, payload: payloadSize(opts), ended: make(chan struct{})}
	c.ps = fuse.NewProtocolServer(fs, opts)
	if err := c.init(settings); err != nil {
		disable(fd)
		return nil, err
	}
	// One loop per online CPU, and one for the queues of the others.
	byCPU := map[int]*loop{}
	var order []*loop
	perLoop := map[*loop][]*entry{}
	fail := func(err error) (*Conn, error) {
		for _, l := range order {
			for _, e := range perLoop[l] {
				unix.Munmap(e.mem)
			}
			l.stop()
		}
		disable(fd)
		return nil, err
	}
	for q, cpu := range qs {
		l := byCPU[cpu]
		if l == nil {
			if l, err = newLoop(cpu); err != nil {
				return fail(err)
			}
			byCPU[cpu] = l
			order = append(order, l)
		}
		for range depth {
			e, err := c.newEntry(l, q)
			if err != nil {
				return fail(err)
			}
			perLoop[l] = append(perLoop[l], e)
		}
	}
	c.live = len(qs) * depth
	var wg sync.WaitGroup
	for _, l := range order {
		es := perLoop[l]
		wg.Add(1)
		l.post(func() {
			for _, e := range es {
				l.add(e)
			}
			// A refused registration completes at once, before the
			// wake-up posted after it is read.
			l.r.enter(0)
			l.post(wg.Done)
		})
	}
	wg.Wait()
	c.mu.Lock()
	err = c.err
	c.mu.Unlock()
	if err != nil {
		return c, fmt.Errorf("register FUSE ring entries: %w", err)
	}
	return c, nil
}

// Ended is closed when the kernel has given back every entry of the
// connection (it was unmounted or aborted).
func (c *Conn) Ended() <-chan struct{} { return c.ended }

// init hands the ProtocolServer the INIT that go-fuse's server answered,
// so that it parses requests for the same protocol and flags.
func (c *Conn) init(settings *fuse.InitIn) error {
	in := *settings
	in.InHeader = fuse.InHeader{Opcode: 26 /* FUSE_INIT */, Unique: 1}
	in.Length = uint32(unsafe.Sizeof(in))
	out := make([]byte, pageSize)
	if _, status := c.ps.HandleRequest([][]byte{unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))}, [][]byte{out}); !status.Ok() {
		return fmt.Errorf("replay INIT: %v", status)
	}
	if err := int32(uint32(out[4]) | uint32(out[5])<<8 | uint32(out[6])<<16 | uint32(out[7])<<24); err != 0 {
		return fmt.Errorf("replay INIT: error %d", err)
	}
	return nil
}

// payloadSize is the kernel's smallest payload buffer for the mount:
// max(FUSE_MIN_READ_BUFFER, max_write, max_pages pages), where go-fuse
// asks for max_write rounded up to pages.
func payloadSize(opts *fuse.MountOptions) int {
	w := opts.MaxWrite
	if w <= 0 {
		w = 128 << 10 // go-fuse's default
	}
	return max(8192, (w+pageSize-1)&^(pageSize-1))
}

// deviceFile returns srv's /dev/fuse file, owned by srv. go-fuse v2.12
// keeps it unexported (Server.fuseFD.file).
func deviceFile(srv *fuse.Server) (*os.File, error) {
	v := reflect.ValueOf(srv).Elem().FieldByName("fuseFD")
	if !v.IsValid() || v.Kind() != reflect.Pointer || v.IsNil() {
		return nil, errors.New("go-fuse server has no fuseFD field")
	}
	f := v.Elem().FieldByName("file")
	if !f.IsValid() || f.Type() != reflect.TypeOf((*os.File)(nil)) {
		return nil, errors.New("go-fuse fuseFD has no file field")
	}
	file := *(**os.File)(unsafe.Pointer(f.UnsafeAddr()))
	if file == nil {
		return nil, errors.New("go-fuse server has no open device")
	}
	return file, nil
}

// ControlDevice calls fn with srv's /dev/fuse descriptor, which stays
// srv's.
func ControlDevice(srv *fuse.Server, fn func(fd uintptr)) error {
	file, err := deviceFile(srv)
	if err != nil {
		return err
	}
	rc, err := file.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(fn)
}

// deviceFD returns a descriptor of srv's /dev/fuse connection of our
// own.
func deviceFD(srv *fuse.Server) (int, error) {
	fd := -1
	var err error
	if cerr := ControlDevice(srv, func(raw uintptr) {
		fd, err = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0)
	}); cerr != nil {
		return -1, cerr
	}
	return fd, err
}

// disable makes the kernel give up io_uring for the connection, so that
// it goes on over /dev/fuse: a registration the kernel refuses (an
// unknown queue) does that. It closes fd.
func disable(fd int) {
	defer unix.Close(fd)
	r, err := newRing(1)
	if err != nil {
		return
	}
	defer r.close()
	s, err := r.next()
	if err != nil {
		return
	}
	var hdr [pageSize]byte
	s.opcode = opURingCmd
	s.fd = int32(fd)
	s.off = cmdRegister
	s.addr = uint64(uintptr(unsafe.Pointer(&hdr[0]))) // never read: the queue is checked first
	s.len = 2
	binary.LittleEndian.PutUint16(s.cmd[16:], 0xffff)
	r.enter(1)
}
