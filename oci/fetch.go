package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Canonical returns ref's canonical name (index.docker.io/library/alpine:latest
// for alpine), or "" when ref is no image reference.
func Canonical(ref string) string { return canonical(ref) }

func canonical(ref string) string {
	r, err := name.ParseReference(ref)
	if err != nil {
		return ""
	}
	return r.Name()
}

// platform is the platform images are picked for from an index.
func platform() v1.Platform { return v1.Platform{OS: "linux", Architecture: runtime.GOARCH} }

// Pull fetches the image ref names from its registry (for an index, the
// image for this machine's platform), with credentials from the Docker
// config as docker login writes it, and unpacks it under its canonical
// name.
func (s *Store) Pull(ctx context.Context, ref string, opts ...remote.Option) (*Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("pull image %s: not an image reference (want [REGISTRY/]REPOSITORY[:TAG|@DIGEST]): %w", ref, err)
	}
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithPlatform(platform()),
		remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	img, err := remote.Image(r, opts...)
	if err != nil {
		return nil, fmt.Errorf("pull image %s from %s: %w", ref, r.Context().RegistryStr(), err)
	}
	return s.Add(ctx, img, r.Name())
}

// Import unpacks the image in path: an OCI image layout directory, or a
// tarball as docker save writes it. Name names it in the store; empty
// takes the tarball's first tag, the layout's ref.name annotation, or
// the file's base name. A tarball or layout holding several images needs
// the name of the one to import.
func (s *Store) Import(ctx context.Context, path, imgName string) (*Image, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("import image from %s: %w", path, err)
	}
	var img v1.Image
	var found string
	if st.IsDir() {
		img, found, err = fromLayout(path, imgName)
	} else {
		img, found, err = fromTarball(path, imgName)
	}
	if err != nil {
		return nil, fmt.Errorf("import image from %s: %w", path, err)
	}
	if imgName == "" {
		imgName = found
	}
	if imgName == "" {
		imgName = filepath.Base(path)
	}
	return s.Add(ctx, img, imgName)
}

func fromTarball(path, imgName string) (v1.Image, string, error) {
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		return nil, "", fmt.Errorf("not a docker save tarball (no manifest.json) nor an OCI layout directory: %w", err)
	}
	var tag *name.Tag
	found := ""
	if imgName != "" && len(m) > 1 {
		t, err := name.NewTag(imgName)
		if err != nil {
			return nil, "", fmt.Errorf("%q is not a tag of the tarball: %w", imgName, err)
		}
		tag = &t
	} else if len(m) > 1 {
		return nil, "", fmt.Errorf("the tarball holds %d images: give --name with the tag of one", len(m))
	}
	if tag == nil && len(m) == 1 && len(m[0].RepoTags) > 0 {
		found = m[0].RepoTags[0]
		if c := canonical(found); c != "" {
			found = c
		}
	}
	img, err := tarball.ImageFromPath(path, tag)
	if err != nil {
		return nil, "", err
	}
	return img, found, nil
}

// refName is the annotation an OCI layout names its images with.
const refName = "org.opencontainers.image.ref.name"

func fromLayout(path, imgName string) (v1.Image, string, error) {
	idx, err := layout.ImageIndexFromPath(path)
	if err != nil {
		return nil, "", fmt.Errorf("not an OCI image layout (index.json): %w", err)
	}
	return pick(idx, imgName, 0)
}

// pick finds the image in an index: the one named imgName (by its
// ref.name annotation) when given, else the one for this platform.
func pick(idx v1.ImageIndex, imgName string, depth int) (v1.Image, string, error) {
	if depth > 4 {
		return nil, "", errors.New("indexes nested too deep")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, "", err
	}
	want := platform()
	var cands []v1.Descriptor
	for _, d := range im.Manifests {
		if imgName != "" && d.Annotations[refName] != "" && d.Annotations[refName] != imgName {
			continue
		}
		if d.Platform != nil && !(d.Platform.OS == want.OS && d.Platform.Architecture == want.Architecture) {
			continue
		}
		cands = append(cands, d)
	}
	if len(cands) == 0 {
		return nil, "", fmt.Errorf("no image for %s/%s%s in it", want.OS, want.Architecture, named(imgName))
	}
	if len(cands) > 1 && imgName == "" {
		return nil, "", fmt.Errorf("it holds %d images: give --name with the %s of one", len(cands), refName)
	}
	d := cands[0]
	switch {
	case d.MediaType.IsImage():
		img, err := idx.Image(d.Digest)
		return img, d.Annotations[refName], err
	case d.MediaType.IsIndex():
		sub, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, "", err
		}
		img, n, err := pick(sub, "", depth+1)
		if n == "" {
			n = d.Annotations[refName]
		}
		return img, n, err
	}
	return nil, "", fmt.Errorf("manifest %s has media type %s, not an image", d.Digest, d.MediaType)
}

func named(n string) string {
	if n == "" {
		return ""
	}
	return " named " + n
}
