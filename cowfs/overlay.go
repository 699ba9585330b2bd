package cowfs

import (
	"container/list"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// maxOpenOverlays bounds the overlay files a branch keeps open. A file
// written since the last commit keeps its overlay file on disk; beyond this
// many, the least recently used are closed and opened again when needed,
// so a branch can hold any number of uncommitted files without running
// out of file descriptors.
const maxOpenOverlays = 256

// overlayFiles orders a branch's open overlay files, least recently used
// at the front.
type overlayFiles struct{ lru list.List }

// overlay returns the file's overlay, creating it at the first write and
// reopening it if it was closed to stay under maxOpenOverlays. Caller
// holds b.mu.
func (b *branch) overlay(in *inode) (*os.File, error) {
	fd := in.f
	if fd.ov != nil {
		b.overlays.lru.MoveToBack(fd.ovElem)
		return fd.ov, nil
	}
	var f *os.File
	var err error
	if fd.ovPath != "" {
		f, err = os.OpenFile(fd.ovPath, os.O_RDWR, 0)
	} else {
		b.ovSeq++
		p := filepath.Join(b.dir, "overlay", strconv.FormatUint(in.ino, 10)+"-"+strconv.FormatUint(b.ovSeq, 10))
		f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if errors.Is(err, os.ErrNotExist) {
			if err = os.MkdirAll(filepath.Dir(p), 0o700); err == nil {
				f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
			}
		}
		if err == nil {
			fd.ovPath = p
		}
	}
	if err != nil {
		return nil, fmt.Errorf("branch %q: open overlay of inode %d: %w", b.name, in.ino, err)
	}
	fd.ov = f
	fd.ovElem = b.overlays.lru.PushBack(fd)
	for b.overlays.lru.Len() > maxOpenOverlays {
		b.closeOverlay(b.overlays.lru.Front().Value.(*fileData))
	}
	return f, nil
}

// closeOverlay closes an overlay file and keeps it on disk.
func (b *branch) closeOverlay(fd *fileData) {
	if fd.ov == nil {
		return
	}
	fd.ov.Close()
	fd.ov = nil
	b.overlays.lru.Remove(fd.ovElem)
	fd.ovElem = nil
}

// dropOverlay closes and removes a file's overlay and frees its
// in-memory bytes. Caller holds b.mu.
func (b *branch) dropOverlay(fd *fileData) {
	if fd == nil {
		return
	}
	b.memFree(fd)
	b.closeOverlay(fd)
	if fd.ovPath != "" {
		if !b.holdOverlay(fd.ovPath) {
			b.removals.remove(fd.ovPath)
		}
		fd.ovPath = ""
	}
}
