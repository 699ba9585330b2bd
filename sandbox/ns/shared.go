package ns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"tine/internal/atomicfile"
)

// The sandboxes that start from one snapshot over the host's OS tree
// share one stacked layer (docs/adr/0215) instead of each linking its
// own: the snapshot's two layers merged (linkLayers), made once, written
// out once. It lives in the runtime's layers directory, as NAME/layer
// beside an empty file NAME/ref; a sandbox's state directory holds
// forkRef, a hard link to ref, and its stacked layer, lowerDir, is a
// symlink to NAME/layer. A layer whose ref has no other link is no
// one's: Sweep removes it. The hard link is made before the symlink, so
// that a crash between them keeps a layer too long, never too short.

// forkRef is, in a state directory whose stacked layer is a shared one,
// the hard link to its ref that keeps it.
const forkRef = "lower.ref"

// sharedLayers is the runtime's layers directory and the layers it made
// this run, by the seed they were made from.
type sharedLayers struct {
	dir string

	mu     sync.Mutex
	bySeed map[string]*sharedLayer
}

// sharedLayer is one shared layer, being made until ready is closed.
type sharedLayer struct {
	name  string
	ready chan struct{}
	err   error // set before ready is closed: why it could not be made
	users int   // starts using it whose references are not made yet
}

// newSharedLayers returns the layers directory dir, made if missing,
// rid of what no state directory refers to.
func newSharedLayers(dir string) (*sharedLayers, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("shared layers: %w", err)
	}
	s := &sharedLayers{dir: dir, bySeed: map[string]*sharedLayer{}}
	return s, s.sweep()
}

// use makes the stacked layer of the state directory dir, named as
// (forkLower in a warm bind, lowerDir in a cold start), the layer shared
// by the sandboxes made from the snapshot state seed (made now if there
// is none), with its reference forkRef. It returns false,
// and makes nothing, where seed's layers cannot be stacked whole
// (linkLayers' bound on depth and path length): the caller stacks
// them its own way.
func (s *sharedLayers) use(ctx context.Context, seed, dir, as string) (bool, error) {
	s.mu.Lock()
	l := s.bySeed[seed]
	mine := l == nil
	if mine {
		l = &sharedLayer{name: randomName(), ready: make(chan struct{})}
		s.bySeed[seed] = l
	}
	l.users++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		l.users--
		if l.err != nil && !isTooDeep(l.err) && s.bySeed[seed] == l {
			delete(s.bySeed, seed) // the next fork tries again
		}
		s.mu.Unlock()
	}()
	if mine {
		l.err = s.make(ctx, seed, l.name)
		close(l.ready)
	} else {
		select {
		case <-l.ready:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	if isTooDeep(l.err) {
		return false, nil
	}
	if l.err != nil {
		return false, l.err
	}
	at := filepath.Join(s.dir, l.name)
	if err := os.Link(filepath.Join(at, "ref"), filepath.Join(dir, forkRef)); err != nil {
		return false, fmt.Errorf("shared layer %s: %w", at, err)
	}
	rel, err := filepath.Rel(dir, filepath.Join(at, "layer"))
	if err == nil {
		err = os.Symlink(rel, filepath.Join(dir, as))
	}
	if err != nil {
		return false, fmt.Errorf("shared layer %s: %w", at, err)
	}
	return true, nil
}

// isTooDeep says whether err is linkLayers' refusal of a layer deeper, or
// with longer paths, than it goes.
func isTooDeep(err error) bool {
	return errors.Is(err, errTooDeep) || errors.Is(err, unix.ENAMETOOLONG)
}

// make makes the shared layer name from the snapshot state seed, whole
// and durable before it takes its name.
func (s *sharedLayers) make(ctx context.Context, seed, name string) error {
	tmp := filepath.Join(s.dir, ".tmp-"+name)
	err := os.Mkdir(tmp, 0o700)
	if err == nil {
		err = osBase("", func(base string) error {
			return linkLayers(ctx, []string{filepath.Join(seed, upperDir), filepath.Join(seed, lowerDir)}, base, filepath.Join(tmp, "layer"))
		})
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(tmp, "ref"), nil, 0o600)
	}
	if err == nil {
		err = syncTree(ctx, tmp)
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.dir, name))
	}
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("shared layer of %s: %w", seed, err)
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return fmt.Errorf("shared layer of %s: %w", seed, err)
	}
	return nil
}

// sweep removes the layers whose ref has no other link and no bind is
// about to link, and what a make cut short left. It decides under the
// lock, and forgets them there, so that no bind takes one it removes;
// the removal itself, long for a large layer, does not hold up binds.
func (s *sharedLayers) sweep() error {
	victims, err := s.unused()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, v := range victims {
		if err := os.RemoveAll(filepath.Join(s.dir, v)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sweep shared layers in %s: %w", s.dir, err)
	}
	return nil
}

// unused returns the entries of the layers directory that sweep removes,
// forgotten by the seeds they were made from.
func (s *sharedLayers) unused() ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	busy := map[string]bool{}
	for _, l := range s.bySeed {
		if l.users > 0 {
			busy[l.name] = true
		}
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	var errs []error
	for _, e := range ents {
		name := strings.TrimPrefix(e.Name(), ".tmp-")
		if busy[name] {
			continue
		}
		if name == e.Name() {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(s.dir, name, "ref"), &st); err == nil && st.Nlink > 1 {
				continue
			} else if err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
				continue
			}
		}
		out = append(out, e.Name())
		for seed, l := range s.bySeed {
			if l.name == name {
				delete(s.bySeed, seed)
			}
		}
	}
	return out, errors.Join(errs...)
}

// keepLayers has the runtime keep shared layers in dir (once; a later
// call changes nothing).
func (r *Runtime) keepLayers(dir string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shared != nil {
		return nil
	}
	s, err := newSharedLayers(dir)
	if err != nil {
		return err
	}
	r.shared = s
	return nil
}

// sharedLayers returns the runtime's shared layers, nil when it keeps none.
func (r *Runtime) sharedLayers() *sharedLayers {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.shared
}

// Sweep implements sandbox.Sweeper: it removes the shared layers no
// state directory refers to any more.
func (r *Runtime) Sweep() error {
	s := r.sharedLayers()
	if s == nil {
		return nil
	}
	return s.sweep()
}

// randomName returns a new shared layer's name.
func randomName() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// isSymlink says whether p is a symlink.
func isSymlink(p string) bool {
	st, err := os.Lstat(p)
	return err == nil && st.Mode()&os.ModeSymlink != 0
}
