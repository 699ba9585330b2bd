package guestagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"tine/guestagent/proto"
)

// openIn opens name inside the agent's root: absolute and relative paths,
// "..", and symlinks all resolve as if the root were "/" (RESOLVE_IN_ROOT),
// and /proc magic links are refused. The root is opened again each time:
// the directory a path names can become another one under a running agent
// (a sandbox's root is replaced when it becomes a fork).
func (a *Agent) openIn(name string, flags int) (int, error) {
	if flags&unix.O_PATH == 0 {
		flags |= unix.O_NOCTTY // openat2 refuses it with O_PATH
	}
	root, err := unix.Open(a.cfg.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open root %s: %w", a.cfg.Root, err)
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, name, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("open %s in %s: %w", name, a.cfg.Root, err)
	}
	return fd, nil
}

// putFile is a file being written: data goes to a new temporary file in
// the target's directory, which End renames over the target, so a reader
// never sees half a file and a cancelled put leaves nothing behind.
type putFile struct {
	c      *conn
	id     uint32
	req    proto.PutRequest
	dirFD  int
	tmp    string
	name   string
	f      *os.File
	failed error
}

// put starts writing req.Path; Data and End frames follow.
func (a *Agent) put(c *conn, id uint32, req proto.PutRequest) {
	p, err := a.startPut(c, id, req)
	if err == nil {
		err = c.register(id, p)
		if err != nil {
			p.abort()
		}
	}
	if err != nil {
		c.fail(id, err) // the client names the path
	}
}

func (a *Agent) startPut(c *conn, id uint32, req proto.PutRequest) (*putFile, error) {
	dir, name := path.Split(path.Clean("/" + req.Path))
	if name == "" || name == "." || name == ".." {
		return nil, errors.New("the path names no file")
	}
	dirFD, err := a.openIn(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	var r [8]byte
	rand.Read(r[:])
	tmp := ".tine-put-" + hex.EncodeToString(r[:])
	fd, err := unix.Openat(dirFD, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		unix.Close(dirFD)
		return nil, fmt.Errorf("create a temporary file in %s: %w", dir, err)
	}
	return &putFile{c: c, id: id, req: req, dirFD: dirFD, tmp: tmp, name: name, f: os.NewFile(uintptr(fd), tmp)}, nil
}

func (p *putFile) frame(f proto.Frame) {
	switch f.Kind {
	case proto.KindData:
		if p.failed == nil {
			if _, err := p.f.Write(f.Payload); err != nil {
				p.failed = fmt.Errorf("write: %w", err)
			}
		}
	case proto.KindEnd:
		p.c.unregister(p.id)
		if err := p.commit(); err != nil {
			p.c.fail(p.id, err)
			return
		}
		p.c.send(proto.Frame{Kind: proto.KindEnd, ID: p.id})
	case proto.KindCancel:
		p.c.unregister(p.id)
		p.abort()
	}
}

func (p *putFile) close() { p.abort() }

// commit sets the mode and renames the temporary file over the target.
func (p *putFile) commit() error {
	err := p.failed
	if err == nil {
		// fchmod, unlike the open mode, is not cut by the umask.
		err = unix.Fchmod(int(p.f.Fd()), p.req.Mode&0o7777)
	}
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(p.dirFD, p.tmp, p.dirFD, p.name)
	}
	if err != nil {
		unix.Unlinkat(p.dirFD, p.tmp, 0)
	}
	unix.Close(p.dirFD)
	return err
}

// abort removes the temporary file.
func (p *putFile) abort() {
	p.f.Close()
	unix.Unlinkat(p.dirFD, p.tmp, 0)
	unix.Close(p.dirFD)
}

// get streams a regular file: FileInfo, Data frames, End.
func (a *Agent) get(c *conn, id uint32, req proto.GetRequest) {
	// O_NONBLOCK keeps a FIFO from blocking the open; the file must then
	// be regular anyway.
	fd, err := a.openIn(req.Path, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		c.fail(id, err)
		return
	}
	f := os.NewFile(uintptr(fd), req.Path)
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s is %s, not a regular file", req.Path, typeName(st.Mode()))
	}
	if err != nil {
		f.Close()
		c.fail(id, err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.register(id, cancelStream(cancel)); err != nil {
		f.Close()
		cancel()
		c.fail(id, err)
		return
	}
	go func() {
		defer f.Close()
		defer cancel()
		defer c.unregister(id)
		if c.sendJSON(proto.KindFileInfo, id, proto.FileInfo{Mode: proto.ModeBits(st.Mode()), Size: st.Size()}) != nil {
			return
		}
		buf := make([]byte, proto.ChunkSize)
		for ctx.Err() == nil {
			n, err := f.Read(buf)
			if n > 0 && c.send(proto.Frame{Kind: proto.KindData, ID: id, Payload: buf[:n]}) != nil {
				return
			}
			if err == io.EOF {
				c.send(proto.Frame{Kind: proto.KindEnd, ID: id})
				return
			}
			if err != nil {
				c.fail(id, fmt.Errorf("read: %w", err))
				return
			}
		}
	}()
}

// typeName names the type of a file that is not regular, for an error.
func typeName(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a fifo"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	}
	return "of type " + m.Type().String()
}
