// Package oci keeps OCI and Docker images as unpacked root file systems
// that sandboxes use as their OS layer. An image comes from a registry
// (Pull), a `docker save` tarball or an OCI image layout directory
// (Import); its layers are unpacked, as hostile input (see Unpack), into
// one directory per image under the store's root, keyed by the image's
// manifest digest, with the image's config beside it. Images share no
// layers with each other.
package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"tine/internal/atomicfile"
)

// ErrNotFound reports an image the store does not hold.
var ErrNotFound = errors.New("image not found")

// Store holds unpacked images under a directory: DIR/HEX/rootfs and
// DIR/HEX/image.json for the manifest digest sha256:HEX. It is safe for
// concurrent use by one process.
type Store struct {
	dir string
	lim Limits
	mu  sync.Mutex // names in image.json files
}

// Config is what the store keeps of an image's config.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Image is an unpacked image's metadata.
type Image struct {
	// Digest is the manifest digest (sha256:HEX): the image's identity.
	Digest string `json:"digest"`
	// Names are the references it was pulled or imported as.
	Names []string `json:"names,omitempty"`
	// Rootfs is the unpacked root file system's directory.
	Rootfs string    `json:"rootfs"`
	Config Config    `json:"config"`
	Layers int       `json:"layers"`
	Stats  Stats     `json:"stats"`
	Added  time.Time `json:"added"`
	// Platform is OS/ARCH[/VARIANT] from the image's config.
	Platform string `json:"platform,omitempty"`
}

// Open returns the store under dir, made if missing, bounding each
// image's unpacking by lim. Half-made images left by a crash are removed.
func Open(dir string, lim Limits) (*Store, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image store %s: %w", dir, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("image store %s: %w", dir, err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return &Store{dir: dir, lim: lim.withDefaults()}, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

func hexOf(digest string) (string, bool) {
	h, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(h) != 64 {
		return "", false
	}
	if _, err := hex.DecodeString(h); err != nil {
		return "", false
	}
	return h, true
}

// Add unpacks img into the store under name (if not empty) and returns
// its metadata. An image whose digest the store holds already only gains
// the name. The rootfs is made in a temporary directory and renamed into
// place once complete.
func (s *Store) Add(ctx context.Context, img v1.Image, name string) (*Image, error) {
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("image %s: manifest digest: %w", name, err)
	}
	h, ok := hexOf(d.String())
	if !ok {
		return nil, fmt.Errorf("image %s: digest %s is not sha256", name, d)
	}
	if have, err := s.Get(d.String()); err == nil {
		return s.addName(have, name)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", name, err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return nil, fmt.Errorf("image %s is for %s, not linux", name, cf.OS)
	}
	ls, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("image %s: layers: %w", name, err)
	}
	if len(ls) > s.lim.Layers {
		return nil, fmt.Errorf("image %s: %d layers, more than the limit of %d", name, len(ls), s.lim.Layers)
	}
	layers := make([]Layer, len(ls))
	for i, l := range ls {
		ld, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("image %s: layer %d: %w", name, i+1, err)
		}
		layers[i] = Layer{Name: ld.String(), Open: l.Uncompressed}
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(s.dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	defer os.RemoveAll(tmp)
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	st, err := Unpack(ctx, rootfs, layers, s.lim)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	im := &Image{Digest: d.String(), Rootfs: filepath.Join(s.dir, h, "rootfs"), Layers: len(ls), Stats: st,
		Added: time.Now().UTC(), Config: Config{Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir,
			User: cf.Config.User, Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd}}
	if cf.Architecture != "" {
		im.Platform = cf.OS + "/" + cf.Architecture
		if cf.Variant != "" {
			im.Platform += "/" + cf.Variant
		}
	}
	if name != "" {
		im.Names = []string{name}
	}
	if err := writeJSON(filepath.Join(tmp, "image.json"), im); err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	if err := atomicfile.SyncFS(tmp); err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Rename(tmp, filepath.Join(s.dir, h)); err != nil {
		if _, serr := os.Stat(filepath.Join(s.dir, h)); serr == nil {
			// Made at the same time by another call: keep that one.
			have, gerr := s.Get(d.String())
			if gerr != nil {
				return nil, gerr
			}
			return s.addNameLocked(have, name)
		}
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	return im, nil
}

func (s *Store) addName(im *Image, name string) (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addNameLocked(im, name)
}

// addNameLocked gives the image the name, taking it from any other
// image that has it.
func (s *Store) addNameLocked(im *Image, name string) (*Image, error) {
	if name == "" {
		return im, nil
	}
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	for _, o := range all {
		if o.Digest == im.Digest {
			im = o
			continue
		}
		if i := indexOf(o.Names, name); i >= 0 {
			o.Names = append(o.Names[:i], o.Names[i+1:]...)
			if err := s.save(o); err != nil {
				return nil, err
			}
		}
	}
	if indexOf(im.Names, name) < 0 {
		im.Names = append(im.Names, name)
		if err := s.save(im); err != nil {
			return nil, err
		}
	}
	return im, nil
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

func (s *Store) save(im *Image) error {
	h, _ := hexOf(im.Digest)
	return writeJSON(filepath.Join(s.dir, h, "image.json"), im)
}

// List returns the store's images, the most recently added first.
func (s *Store) List() ([]*Image, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("image store %s: %w", s.dir, err)
	}
	var out []*Image
	for _, e := range ents {
		if _, ok := hexOf("sha256:" + e.Name()); !ok {
			continue
		}
		var im Image
		if err := readJSON(filepath.Join(s.dir, e.Name(), "image.json"), &im); err != nil {
			continue
		}
		im.Rootfs = filepath.Join(s.dir, e.Name(), "rootfs")
		out = append(out, &im)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Added.After(out[j].Added) })
	return out, nil
}

// Get finds an image by digest (sha256:HEX, or 12 or more leading hex
// digits) or by name (as given, or in its canonical form, so "alpine"
// finds index.docker.io/library/alpine:latest).
func (s *Store) Get(ref string) (*Image, error) {
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	canon := canonical(ref)
	for _, im := range all {
		if indexOf(im.Names, ref) >= 0 || (canon != "" && indexOf(im.Names, canon) >= 0) {
			return im, nil
		}
	}
	prefix := strings.TrimPrefix(ref, "sha256:")
	if len(prefix) >= 12 {
		var found *Image
		for _, im := range all {
			if strings.HasPrefix(strings.TrimPrefix(im.Digest, "sha256:"), prefix) {
				if found != nil {
					return nil, fmt.Errorf("image %s: names more than one image's digest; give more digits", ref)
				}
				found = im
			}
		}
		if found != nil {
			return found, nil
		}
	}
	return nil, fmt.Errorf("image %s: %w (tine image pull or tine image import adds it; tine image ls lists those held)", ref, ErrNotFound)
}

// Remove deletes the image ref names: by a name, that name, and the
// image once no name is left; by digest, the image.
func (s *Store) Remove(ref string) (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	im, err := s.Get(ref)
	if err != nil {
		return nil, err
	}
	name := ref
	if indexOf(im.Names, name) < 0 {
		name = canonical(ref)
	}
	if i := indexOf(im.Names, name); i >= 0 && len(im.Names) > 1 {
		im.Names = append(im.Names[:i], im.Names[i+1:]...)
		return im, s.save(im)
	}
	h, _ := hexOf(im.Digest)
	// Renamed first, so that a crash during removal leaves no image that
	// looks whole.
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(s.dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	if err := os.Rename(filepath.Join(s.dir, h), tmp); err != nil {
		return nil, fmt.Errorf("remove image %s: %w", ref, err)
	}
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("remove image %s: %w", ref, err)
	}
	return im, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, append(b, '\n'), 0o600)
}

// maxJSON bounds an image.json read back.
const maxJSON = 1 << 20

func readJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxJSON+1))
	if err != nil {
		return err
	}
	if len(b) > maxJSON {
		return fmt.Errorf("%s: more than %d bytes", path, maxJSON)
	}
	return json.Unmarshal(b, v)
}
