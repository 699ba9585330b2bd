package guestagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"

	"golang.org/x/sys/unix"

	"tine/guestagent/proto"
	"tine/internal/treecopy"
)

// putTree is a tree being copied in: the Data frames feed a pipe that
// treecopy.Extract reads in its own goroutine, so the connection's reader
// waits only while the extractor catches up, and a failed extraction
// turns the rest of the stream's writes into no-ops.
type putTree struct {
	c      *conn
	id     uint32
	pw     *io.PipeWriter
	cancel context.CancelFunc
}

// errCancelled ends a put-tree the host cancelled.
var errCancelled = errors.New("cancelled by the host")

// putTree starts extracting a tar stream at req.Path; Data and End frames
// follow. The agent answers End once every entry is in place, or Error.
func (a *Agent) putTree(c *conn, id uint32, req proto.PutTreeRequest) {
	parentFD, dir, name, err := a.treeTarget(req)
	if err != nil {
		c.fail(id, err) // the client names the path
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	p := &putTree{c: c, id: id, pw: pw, cancel: cancel}
	if err := c.register(id, p); err != nil {
		unix.Close(parentFD)
		cancel()
		c.fail(id, err)
		return
	}
	go func() {
		defer unix.Close(parentFD)
		defer cancel()
		st, err := treecopy.Extract(ctx, pr, parentFD, name, treecopy.Options{KeepSpecial: true})
		if err == nil {
			// The answer comes after the host's End: what follows tar's
			// end marker (a record's padding) is read and dropped.
			_, err = io.Copy(io.Discard, pr)
		}
		// A stream that failed early stops taking data; one that ended
		// has nothing left to read.
		pr.CloseWithError(errors.Join(err, io.ErrClosedPipe))
		c.unregister(id)
		if err != nil {
			c.fail(id, err) // the client names the path
			return
		}
		c.sendJSON(proto.KindEnd, id, proto.PutTreeResult{Path: path.Join(dir, st.Name)})
	}()
}

// treeTarget opens the directory a put-tree lands in, dir: req.Path when
// it is an existing directory (the top entry then keeps its name, "" for
// name), or else its parent, with name its last element.
func (a *Agent) treeTarget(req proto.PutTreeRequest) (fd int, dir, name string, err error) {
	p := path.Clean("/" + req.Path)
	if fd, err := a.openIn(p, unix.O_PATH|unix.O_DIRECTORY); err == nil {
		return fd, p, "", nil
	} else if req.Into || p == "/" {
		return -1, "", "", fmt.Errorf("not an existing directory: %w", err)
	}
	dir, name = path.Split(p)
	if fd, err = a.openIn(dir, unix.O_PATH|unix.O_DIRECTORY); err != nil {
		return -1, "", "", fmt.Errorf("the directory it goes in: %w", err)
	}
	return fd, dir, name, nil
}

func (p *putTree) frame(f proto.Frame) {
	switch f.Kind {
	case proto.KindData:
		// An error means the extraction ended; it answers for itself.
		p.pw.Write(f.Payload)
	case proto.KindEnd:
		p.pw.Close()
	case proto.KindCancel:
		p.close()
	}
}

func (p *putTree) close() {
	p.cancel()
	p.pw.CloseWithError(errCancelled)
}

// getTree streams the file, symlink or tree at req.Path as a tar stream in
// Data frames, then End; an error part way ends the stream with Error.
func (a *Agent) getTree(c *conn, id uint32, req proto.GetTreeRequest) {
	dir, name := path.Split(path.Clean("/" + req.Path))
	if name == "" {
		c.fail(id, errors.New("name a file or directory below /"))
		return
	}
	parentFD, err := a.openIn(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		c.fail(id, err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.register(id, cancelStream(cancel)); err != nil {
		unix.Close(parentFD)
		cancel()
		c.fail(id, err)
		return
	}
	go func() {
		defer unix.Close(parentFD)
		defer cancel()
		defer c.unregister(id)
		fw := &frameWriter{c: c, id: id}
		_, err := treecopy.Archive(ctx, fw, parentFD, name)
		if fw.err != nil {
			return // the connection is gone
		}
		if err != nil {
			c.fail(id, err)
			return
		}
		c.send(proto.Frame{Kind: proto.KindEnd, ID: id})
	}()
}

// frameWriter sends what is written to it as Data frames of one stream.
type frameWriter struct {
	c   *conn
	id  uint32
	err error
}

func (w *frameWriter) Write(b []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	n := len(b)
	for len(b) > 0 {
		k := min(len(b), proto.ChunkSize)
		if w.err = w.c.send(proto.Frame{Kind: proto.KindData, ID: w.id, Payload: b[:k]}); w.err != nil {
			return 0, w.err
		}
		b = b[k:]
	}
	return n, nil
}
