package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"tine/sandbox"

	"golang.org/x/sys/unix"
)

// forkDirty: fork into 1 of a running sandbox right after another writer
// (a build, a sibling sandbox) left o.dirty bytes unwritten on the state
// root's file system, beside the same fork with nothing dirty and one
// bwrap true in the same dirty moment. A snapshot that wrote its state
// out with syncfs waited for all of it (ADR 0216).
func (b *bench) forkDirty(ctx context.Context, rep *report) error {
	parent, err := b.parent(ctx, "d", "head -c 1000000 /dev/urandom > /root/blob; sleep 100000 & true")
	if err != nil {
		return err
	}
	defer b.warm.Remove(ctx, parent)
	fork := func() (time.Duration, error) {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		b.warmRT.WaitWarm(wctx, 1)
		cancel()
		name := b.name("dk")
		t := time.Now()
		if _, err := b.warm.Fork(ctx, parent, sandbox.ForkOptions{N: 1, Names: []string{name}}); err != nil {
			return 0, err
		}
		err := first(ctx, b.warm, name)
		d := time.Since(t)
		b.warm.Remove(ctx, name)
		return d, err
	}
	junk := filepath.Join(b.base, "dirty")
	defer os.Remove(junk)
	var quiet, dirty, bw []time.Duration
	for i := 0; i < max(2, b.o.forkRep[1]/2); i++ {
		unix.Sync()
		d, err := fork()
		if err != nil {
			return err
		}
		quiet = append(quiet, d)
		if err := writeJunk(junk, b.o.dirty); err != nil {
			return err
		}
		if d, err = fork(); err != nil {
			return err
		}
		dirty = append(dirty, d)
		s, err := timeCmd(ctx, 1, "bwrap", "--unshare-all", "--ro-bind", "/", "/", "true")
		if err != nil {
			return err
		}
		bw = append(bw, s...)
		os.Remove(junk)
	}
	unix.Sync()
	sec := "fork x1, host writer"
	what := fmt.Sprintf("Fork into 1, answered `true`, after a host writer left %d MiB dirty on the state root's disk", b.o.dirty>>20)
	rep.add(sec, "tine", what, dirty, "")
	rep.add(sec, "tine, nothing dirty", "The same fork with nothing dirty", quiet, "")
	rep.add(sec, "bwrap", "bwrap true, in the same dirty moment (writes nothing)", bw, "")
	return nil
}

// writeJunk writes n bytes to path and leaves them dirty (no fsync).
func writeJunk(path string, n int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	for w := int64(0); w < n; w += int64(len(buf)) {
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
