package vm

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"tine/chunkstore"
	"tine/internal/atomicfile"
	"tine/internal/filecopy"
	"tine/sandbox"
	"tine/vmm"
	"tine/vmm/linux"
)

// A vm sandbox's state directory (sandbox.Spec.Dir, or a snapshot's
// copy of it) holds:
//
//	vm.json   the manifest: the disk's chunk-store root, whether an
//	          image is present, and the guest's size
//	image/    the memory image (vmm image directory: memory, machine)
//	          when the state was taken from a running machine
//
// Every state directory keeps its disk alive in the chunk store with a
// ref "vm-state/HASH", HASH naming the directory's path. The ref points
// at a holder node that links the disk root(s) and carries the path; a
// runtime opening the store drops the holders of directories that are
// gone and trims the others to the disk their manifest names.

// manifest is a state directory's vm.json.
type manifest struct {
	Disk        string `json:"disk,omitempty"`
	Image       bool   `json:"image,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	CPUs        int    `json:"cpus,omitempty"`
}

const (
	manifestName = "vm.json"
	imageDir     = "image"
	refPrefix    = "vm-state/"
	holderMagic  = "TINEVMREF1\n"
	maxManifest  = 4096
)

func readManifest(dir string) (manifest, error) {
	var m manifest
	name := filepath.Join(dir, manifestName)
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, fmt.Errorf("vm state: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxManifest+1))
	if err == nil && len(b) > maxManifest {
		err = fmt.Errorf("more than %d bytes", maxManifest)
	}
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		return m, fmt.Errorf("vm state %s: %w", name, err)
	}
	return m, nil
}

// writeState makes state directory to: fill puts the image (if any) in
// a temporary directory and returns the manifest; the disk is referenced
// for to, the manifest written, and the directory renamed into place.
func (r *Runtime) writeState(to string, fill func(tmp string) (manifest, error)) error {
	abs, err := filepath.Abs(to)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(abs), ".tmp-"+filepath.Base(abs))
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("vm runtime: %w", err)
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return fmt.Errorf("vm runtime: %w", err)
	}
	fail := func(err error) error {
		os.RemoveAll(tmp)
		return err
	}
	m, err := fill(tmp)
	if err != nil {
		return fail(err)
	}
	if err := r.holdDisk(abs, m.Disk, true); err != nil {
		return fail(err)
	}
	b, _ := json.Marshal(m)
	if err := atomicfile.WriteFile(filepath.Join(tmp, manifestName), b, 0o600); err != nil {
		return fail(fmt.Errorf("vm runtime: %w", err))
	}
	if err := os.Rename(tmp, abs); err != nil {
		return fail(fmt.Errorf("vm runtime: %w", err))
	}
	if err := atomicfile.SyncDir(filepath.Dir(abs)); err != nil {
		return fmt.Errorf("vm runtime: %w", err)
	}
	return nil
}

// stopped records a stopped machine's disk in its state directory and
// drops the memory image it was cloned from (the next start boots).
func (r *Runtime) stopped(dir string, root chunkstore.ID) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	m, err := readManifest(abs)
	if err != nil {
		return err
	}
	m.Disk, m.Image = root.String(), false
	// Hold old and new disk until the manifest names the new one.
	if err := r.holdDisk(abs, m.Disk, true); err != nil {
		return err
	}
	b, _ := json.Marshal(m)
	if err := atomicfile.WriteFile(filepath.Join(abs, manifestName), b, 0o600); err != nil {
		return fmt.Errorf("vm runtime: %w", err)
	}
	if err := os.RemoveAll(filepath.Join(abs, imageDir)); err != nil {
		return fmt.Errorf("vm runtime: %w", err)
	}
	return r.holdDisk(abs, m.Disk, false)
}

// linkImage hard-links an image directory's files into a new directory
// (copying them where the file system cannot link).
func linkImage(from, to string) error {
	if err := os.Mkdir(to, 0o700); err != nil {
		return err
	}
	for _, n := range []string{vmm.ImageMemoryFile, vmm.ImageMachineFile} {
		src, dst := filepath.Join(from, n), filepath.Join(to, n)
		if err := os.Link(src, dst); err != nil {
			if err := copyFile(src, dst); err != nil {
				return err
			}
		}
	}
	return atomicfile.SyncDir(to)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = filecopy.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// refName is the chunk-store ref that keeps state directory abs's disk.
func refName(abs string) string {
	sum := sha256.Sum256([]byte(abs))
	return refPrefix + hex.EncodeToString(sum[:16])
}

// holdDisk points abs's ref at a holder of disk (plus, with keep, the
// disks it held already); an empty disk drops the ref.
func (r *Runtime) holdDisk(abs, disk string, keep bool) error {
	name := refName(abs)
	old, err := r.store.GetRef(name)
	if err != nil && !errors.Is(err, chunkstore.ErrNotFound) {
		return fmt.Errorf("vm runtime: %w", err)
	}
	var links []chunkstore.ID
	if keep && !old.IsZero() {
		if links, _, err = r.readHolder(old); err != nil {
			links = nil // a damaged holder is replaced
		}
	}
	if disk != "" {
		id, err := chunkstore.ParseID(disk)
		if err != nil {
			return fmt.Errorf("vm runtime: disk root %q: %w", disk, err)
		}
		if !slices.Contains(links, id) {
			links = append(links, id)
		}
	}
	if len(links) == 0 {
		if old.IsZero() {
			return nil
		}
		return r.store.DeleteRef(name, old)
	}
	holder, err := r.store.PutNode(links, []byte(holderMagic+abs))
	if err != nil {
		return fmt.Errorf("vm runtime: %w", err)
	}
	if holder == old {
		return nil
	}
	if err := r.store.SetRef(name, old, holder); err != nil {
		return fmt.Errorf("vm runtime: keep the disk of %s: %w", abs, err)
	}
	return nil
}

// readHolder returns the disks a holder node links and its directory.
func (r *Runtime) readHolder(id chunkstore.ID) ([]chunkstore.ID, string, error) {
	links, payload, err := r.store.GetNode(id)
	if err != nil {
		return nil, "", err
	}
	if !strings.HasPrefix(string(payload), holderMagic) || len(payload) > 4096+len(holderMagic) {
		return nil, "", fmt.Errorf("vm runtime: ref node %s is not a state holder", id)
	}
	return links, string(payload[len(holderMagic):]), nil
}

// pruneRefs drops the refs of state directories that are gone and trims
// the others to the disk their manifest names.
func (r *Runtime) pruneRefs() error {
	refs, err := r.store.ListRefs(refPrefix)
	if err != nil {
		return fmt.Errorf("vm runtime: %w", err)
	}
	for name, id := range refs {
		_, dir, err := r.readHolder(id)
		if err != nil || refName(dir) != name {
			continue // not ours to judge: leave it
		}
		m, err := readManifest(dir)
		if err != nil {
			continue // unreadable now; keep its disk
		}
		if _, serr := os.Stat(filepath.Join(dir, manifestName)); errors.Is(serr, os.ErrNotExist) {
			m.Disk = ""
		}
		if err := r.holdDisk(dir, m.Disk, false); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the runtime's disk store. Stop the sandboxes first.
func (r *Runtime) Close() error { return r.store.Close() }

// MinMemory is the least guest RAM a vm sandbox gets: Debian's kernel
// and the guest's initramfs need about this much to reach the agent.
const MinMemory = 128 << 20

// GuestSize implements sandbox.GuestSizer: a vm sandbox's guest RAM and
// vCPUs, the runtime's defaults where want leaves them zero. It refuses,
// with the reason, what the VMM cannot give a guest.
func (r *Runtime) GuestSize(want *sandbox.GuestSize) (sandbox.GuestSize, error) {
	g := sandbox.GuestSize{MemoryBytes: int64(r.cfg.MemSize), CPUs: r.cfg.CPUs}
	if want != nil {
		if want.MemoryBytes != 0 {
			g.MemoryBytes = want.MemoryBytes
		}
		if want.CPUs != 0 {
			g.CPUs = want.CPUs
		}
	}
	switch {
	case g.MemoryBytes < MinMemory:
		return g, fmt.Errorf("vm guest memory %d bytes: want at least %d MiB (the guest kernel needs it)", g.MemoryBytes, MinMemory>>20)
	case g.MemoryBytes > linux.MaxMem:
		return g, fmt.Errorf("vm guest memory %d MiB: the VMM places guest RAM below the 3 GiB device hole, so at most %d MiB", g.MemoryBytes>>20, linux.MaxMem>>20)
	case g.MemoryBytes%vmm.PageSize != 0:
		return g, fmt.Errorf("vm guest memory %d bytes: want a multiple of 4 KiB", g.MemoryBytes)
	case g.CPUs < 1 || g.CPUs > linux.MaxVCPUs:
		return g, fmt.Errorf("vm guest vCPUs %d: want 1 to %d", g.CPUs, linux.MaxVCPUs)
	}
	return g, nil
}
