package fsbench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"tine/bench/internal/peer"
)

// view is a mounted filesystem under test: read holds the base content
// (the image a sandbox starts from), write is where new files go.
type view struct{ read, write string }

// mounter gives one system's view of a base directory.
type mounter interface {
	mount(ctx context.Context, base string) (view, error)
	unmount() error
}

const bigName = "big.bin"

// baseProject is where the agent section puts the project in the
// starting content of every filesystem.
const baseProject = "project"

func ioSection(ctx context.Context, e *env) (*section, error) {
	cfg := e.cfg
	sec := &section{
		Title: "Data and metadata",
		Note: "The base image (a " + size(cfg.BigFile) + " file of random bytes) is the lower layer of the overlays, " +
			"the imported snapshot for tine and a plain directory for native; writes go to the writable layer. " +
			"cold: caches dropped (echo 3 > /proc/sys/vm/drop_caches) before each sample; a FUSE server's own " +
			"memory is not dropped. first read: the first read of the base file after the mount (one sample); the cold row follows it. warm: the same data read just before. seq write: 1 MiB writes, then fsync. " +
			"Metadata rows: one directory per 500 files; untar and go build run tar and go as processes " +
			"(go build: module sources and GOCACHE on the filesystem under test, stdlib already in that cache, " +
			"all module packages recompiled each sample).",
	}
	baseDir, err := e.dir("io", "base")
	if err != nil {
		return sec, err
	}
	e.cfg.logf("io: writing %s base file", size(cfg.BigFile))
	if err := writeRandomFile(filepath.Join(baseDir, bigName), cfg.BigFile, 1); err != nil {
		return sec, err
	}
	readGoal := &goal{Text: ">= 0.9x native", Peer: toolNative, MinRatio: 0.9}
	metaGoal := &goal{Text: "<= 2x native, < fuse-overlayfs", Peer: toolNative, MaxRatio: 2, Faster: toolFuseOverlay}
	rSeqW := newRow("seq write "+size(cfg.BigFile)+" + fsync", unitBytesPS, "-", nil)
	rSeqR1 := newRow("seq read "+size(cfg.BigFile)+", first read", unitBytesPS, "cold", readGoal)
	rSeqRC := newRow("seq read "+size(cfg.BigFile), unitBytesPS, "cold", readGoal)
	rSeqRW := newRow("seq read "+size(cfg.BigFile), unitBytesPS, "warm", readGoal)
	rRand := newRow("random 4 KiB read, per read", unitSeconds, "cold", nil)
	rCreate := newRow("create "+count(cfg.MetaFiles)+" files", unitSeconds, "warm", metaGoal)
	rStat := newRow("stat "+count(cfg.MetaFiles)+" files", unitSeconds, "warm", metaGoal)
	rUnlink := newRow("unlink "+count(cfg.MetaFiles)+" files", unitSeconds, "warm", metaGoal)
	sec.Rows = append(sec.Rows, rSeqW, rSeqR1, rSeqRC, rSeqRW, rRand, rCreate, rStat, rUnlink)

	var tarball string
	var rUntar, rBuild *row
	if cfg.Untar {
		src, err := goSrc()
		if err != nil {
			return sec, err
		}
		what, dir := "Go src", filepath.Dir(src)
		sub := "src"
		if cfg.UntarSubdir != "" {
			what, dir, sub = "Go src/"+cfg.UntarSubdir, src, cfg.UntarSubdir
		}
		n, err := countFiles(filepath.Join(dir, sub))
		if err != nil {
			return sec, err
		}
		tarball = filepath.Join(e.work, "io", "src.tar")
		if _, err := peer.Run(ctx, "", "tar", "-cf", tarball, "-C", dir, sub); err != nil {
			return sec, fmt.Errorf("make tarball of %s: %w", filepath.Join(dir, sub), err)
		}
		rUntar = newRow(fmt.Sprintf("untar %s (%s files)", what, count(n)), unitSeconds, "warm", metaGoal)
	}
	var gb *goBuild
	if cfg.GoBuild {
		if gb, err = e.goBuild(ctx); err != nil {
			return sec, err
		}
		rBuild = newRow("go build, small module", unitSeconds, "warm", metaGoal)
		sec.Rows = append(sec.Rows, rBuild)
	}
	if rUntar != nil {
		sec.Rows = append(sec.Rows, rUntar)
	}

	for ti, tool := range []string{toolTine, toolNative, toolOverlay, toolFuseOverlay} {
		if !cfg.Tools[tool] {
			continue
		}
		e.cfg.logf("io: %s", tool)
		work, err := e.dir("io", slug(tool))
		if err != nil {
			return sec, err
		}
		var m mounter
		switch tool {
		case toolTine:
			m = &tineMounter{cl: e.cl, base: work}
		case toolNative:
			m = &nativeMounter{base: work}
		case toolOverlay:
			m = &overlayMounter{cl: e.cl, base: work}
		case toolFuseOverlay:
			m = &overlayMounter{cl: e.cl, base: work, fuse: true}
		}
		v, err := m.mount(ctx, baseDir)
		if err != nil {
			for _, r := range sec.Rows {
				record(r, tool, nil, err)
			}
			if fatal(ctx, err) {
				return sec, err
			}
			continue
		}
		big := filepath.Join(v.read, bigName)
		slow := cfg.SlowReps

		// Sequential write: a fresh random buffer per sample, so no two
		// samples write the same bytes.
		buf := make([]byte, cfg.BigFile)
		s, err := sample(ctx, slow, func(i int) error {
			fillRandom(buf, uint64(100+ti), uint64(i))
			return nil
		}, func(i int) error {
			return writeFileSync(filepath.Join(v.write, fmt.Sprintf("seqw-%d.bin", i)), buf, 1<<20)
		}, func(i int) error {
			return os.Remove(filepath.Join(v.write, fmt.Sprintf("seqw-%d.bin", i)))
		})
		record(rSeqW, tool, throughput(cfg.BigFile, s), err)
		buf = nil

		// The first read of the base file after the mount: what a new
		// sandbox sees. Later cold reads may find work done by the first.
		s, err = sample(ctx, 1, func(int) error { return peer.DropCaches() },
			func(int) error { return readAll(big, cfg.BigFile) }, nil)
		record(rSeqR1, tool, throughput(cfg.BigFile, s), err)
		s, err = sample(ctx, slow, func(int) error { return peer.DropCaches() },
			func(int) error { return readAll(big, cfg.BigFile) }, nil)
		record(rSeqRC, tool, throughput(cfg.BigFile, s), err)
		s, err = sample(ctx, slow, func(i int) error {
			if i == 0 {
				return readAll(big, cfg.BigFile)
			}
			return nil
		}, func(int) error { return readAll(big, cfg.BigFile) }, nil)
		record(rSeqRW, tool, throughput(cfg.BigFile, s), err)

		s, err = sample(ctx, slow, func(int) error { return peer.DropCaches() },
			func(i int) error { return randomReads(big, cfg.BigFile, cfg.RandReads, uint64(i)) }, nil)
		for j := range s {
			s[j] /= float64(cfg.RandReads)
		}
		record(rRand, tool, s, err)

		var created, stated, unlinked []float64
		var merr error
		for i := 0; i < slow && merr == nil; i++ {
			var c, st, u float64
			c, st, u, merr = metadata(ctx, filepath.Join(v.write, fmt.Sprintf("meta-%d", i)), cfg.MetaFiles)
			if merr == nil {
				created, stated, unlinked = append(created, c), append(stated, st), append(unlinked, u)
			}
		}
		record(rCreate, tool, created, merr)
		record(rStat, tool, stated, merr)
		record(rUnlink, tool, unlinked, merr)

		if rBuild != nil {
			s, err = gb.measure(ctx, filepath.Join(v.write, "gobuild"), slow)
			record(rBuild, tool, s, err)
		}
		if rUntar != nil {
			s, err = sample(ctx, slow, func(i int) error {
				return os.Mkdir(filepath.Join(v.write, fmt.Sprintf("untar-%d", i)), 0o755)
			}, func(i int) error {
				_, err := peer.Run(ctx, "", "tar", "-xf", tarball, "-C", filepath.Join(v.write, fmt.Sprintf("untar-%d", i)))
				return err
			}, nil)
			record(rUntar, tool, s, err)
		}
		if err := m.unmount(); err != nil {
			return sec, err
		}
		if ctx.Err() != nil {
			return sec, ctx.Err()
		}
	}
	return sec, nil
}

func throughput(bytes int64, secs []float64) []float64 {
	out := make([]float64, len(secs))
	for i, s := range secs {
		out[i] = float64(bytes) / s
	}
	return out
}

// fillRandom fills b with random bytes from the stream (a, b2).
func fillRandom(b []byte, a, b2 uint64) {
	var seed [32]byte
	for k := 0; k < 8; k++ {
		seed[k], seed[8+k] = byte(a>>(8*k)), byte(b2>>(8*k))
	}
	_, _ = rand.NewChaCha8(seed).Read(b)
}

// writeRandomFile writes n random bytes to path in 1 MiB pieces.
func writeRandomFile(path string, n int64, seed uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	var s [32]byte
	s[0] = byte(seed)
	r := rand.NewChaCha8(s)
	_, err = io.CopyN(f, r, n)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeFileSync writes b to a new file at path in writes of piece bytes,
// then fsyncs it.
func writeFileSync(path string, b []byte, piece int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("seq write %s: %w", path, err)
	}
	for off := 0; off < len(b) && err == nil; off += piece {
		_, err = f.Write(b[off:min(off+piece, len(b))])
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("seq write %s: %w", path, err)
	}
	return nil
}

// readAll reads path in 1 MiB pieces and checks that it got want bytes.
func readAll(path string, want int64) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("seq read %s: %w", path, err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, err := f.Read(buf)
		n += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("seq read %s at %d: %w", path, n, err)
		}
	}
	if n != want {
		return fmt.Errorf("seq read %s: got %d bytes, want %d", path, n, want)
	}
	return nil
}

// randomReads does n 4 KiB reads at random aligned offsets of path.
func randomReads(path string, size int64, n int, seed uint64) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("random read %s: %w", path, err)
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(seed, 4096))
	buf := make([]byte, 4096)
	pages := size / 4096
	for i := 0; i < n; i++ {
		off := r.Int64N(pages) * 4096
		if _, err := f.ReadAt(buf, off); err != nil {
			return fmt.Errorf("random read %s at %d: %w", path, off, err)
		}
	}
	return nil
}

// metadata creates n empty files under dir (500 per subdirectory, made
// untimed first), stats each, then unlinks each, and returns the seconds
// of the three phases.
func metadata(ctx context.Context, dir string, n int) (create, stat, unlink float64, err error) {
	const perDir = 500
	paths := make([]string, n)
	for i := range paths {
		d := filepath.Join(dir, fmt.Sprintf("d%03d", i/perDir))
		if i%perDir == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return 0, 0, 0, fmt.Errorf("metadata dir %s: %w", d, err)
			}
		}
		paths[i] = filepath.Join(d, fmt.Sprintf("f%06d", i))
	}
	phase := func(op func(p string) error) (float64, error) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		s, err := sample(ctx, 1, nil, func(int) error {
			for _, p := range paths {
				if err := op(p); err != nil {
					return err
				}
			}
			return nil
		}, nil)
		if err != nil {
			return 0, err
		}
		return s[0], nil
	}
	if create, err = phase(func(p string) error {
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		return unix.Close(fd)
	}); err != nil {
		return
	}
	var st unix.Stat_t
	if stat, err = phase(func(p string) error {
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		return nil
	}); err != nil {
		return
	}
	if unlink, err = phase(func(p string) error {
		if err := unix.Unlink(p); err != nil {
			return fmt.Errorf("unlink %s: %w", p, err)
		}
		return nil
	}); err != nil {
		return
	}
	if err = os.RemoveAll(dir); err != nil {
		err = fmt.Errorf("remove %s: %w", dir, err)
	}
	return
}

type nativeMounter struct{ base string }

func (m *nativeMounter) mount(ctx context.Context, base string) (view, error) {
	w := filepath.Join(m.base, "rw")
	if err := os.MkdirAll(w, 0o755); err != nil {
		return view{}, fmt.Errorf("native dir %s: %w", w, err)
	}
	return view{read: base, write: w}, nil
}

func (m *nativeMounter) unmount() error { return nil }

type overlayMounter struct {
	cl   *peer.Cleanups
	base string
	fuse bool
	dir  string
}

func (m *overlayMounter) mount(ctx context.Context, base string) (view, error) {
	o := peer.Overlay{
		Lower: []string{base},
		Upper: filepath.Join(m.base, "upper"),
		Work:  filepath.Join(m.base, "work"),
		Dir:   filepath.Join(m.base, "mnt"),
	}
	m.dir = o.Dir
	var err error
	if m.fuse {
		err = peer.MountFuseOverlay(ctx, m.cl, o)
	} else {
		err = peer.MountOverlay(m.cl, o)
	}
	return view{read: o.Dir, write: o.Dir}, err
}

func (m *overlayMounter) unmount() error { return peer.Unmount(m.dir) }

func size(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}
