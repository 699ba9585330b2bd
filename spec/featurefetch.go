package spec

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"tine/oci"
)

// FeatureLayerType is the media type of the one layer of a devcontainer
// feature's OCI artifact: an uncompressed tar of the feature directory.
const FeatureLayerType = "application/vnd.devcontainers.layer.v1+tar"

// FeatureFetcher fetches OCI features (REGISTRY/REPOSITORY:TAG or
// @DIGEST) from their registry and keeps each unpacked under Dir by its
// manifest digest.
type FeatureFetcher struct {
	// Dir holds one directory per fetched feature, named by digest.
	Dir string
	// Remote are extra options for the registry client (transport,
	// credentials); credentials default to the Docker config's.
	Remote []remote.Option
}

// fetch returns the directory holding the feature ref names. A ref by
// digest that is cached is not fetched again; a tag is resolved at the
// registry each time, and its content fetched only when its digest is
// new.
func (f *FeatureFetcher) fetch(ctx context.Context, ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("features: %q: want a local feature (\"./NAME\") or an OCI reference (REGISTRY/REPOSITORY[:TAG|@DIGEST]): %w", ref, err)
	}
	if f == nil || f.Dir == "" {
		return "", fmt.Errorf("features: %q: OCI features are fetched only with a feature cache", ref)
	}
	if d, ok := r.(name.Digest); ok {
		if dir, ok := f.cached(d.DigestStr()); ok {
			return dir, nil
		}
	}
	opts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, f.Remote...)
	img, err := remote.Image(r, opts...)
	if err != nil {
		return "", fmt.Errorf("features: fetch %s from %s: %w", ref, r.Context().RegistryStr(), err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("features: %s: %w", ref, err)
	}
	if dir, ok := f.cached(digest.String()); ok {
		return dir, nil
	}
	m, err := img.Manifest()
	if err != nil {
		return "", fmt.Errorf("features: %s: manifest: %w", ref, err)
	}
	if len(m.Layers) != 1 || string(m.Layers[0].MediaType) != FeatureLayerType {
		return "", fmt.Errorf("features: %s: not a devcontainer feature: want one layer of type %s", ref, FeatureLayerType)
	}
	if m.Layers[0].Size > MaxFeatureBytes+MaxFeatureEntries*1024 || m.Layers[0].Size < 0 {
		return "", fmt.Errorf("features: %s: a layer of %d bytes, more than a feature may have", ref, m.Layers[0].Size)
	}
	layer, err := img.LayerByDigest(m.Layers[0].Digest)
	if err != nil {
		return "", fmt.Errorf("features: %s: %w", ref, err)
	}
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(f.Dir, ".fetch-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "feature")
	if err := os.Mkdir(root, 0o755); err != nil {
		return "", err
	}
	// The blob is the tar itself (Compressed is the blob as stored). It is
	// read whole, bounded by the size checked above, so that its digest
	// is checked at its end before any of it is used.
	rc, err := layer.Compressed()
	if err != nil {
		return "", fmt.Errorf("features: %s: %w", ref, err)
	}
	blob, err := io.ReadAll(io.LimitReader(rc, m.Layers[0].Size+1))
	rc.Close()
	if err == nil && int64(len(blob)) != m.Layers[0].Size {
		err = fmt.Errorf("%d bytes, the manifest says %d", len(blob), m.Layers[0].Size)
	}
	if err != nil {
		return "", fmt.Errorf("features: %s: layer %s: %w", ref, m.Layers[0].Digest, err)
	}
	open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(blob)), nil }
	lim := oci.Limits{Bytes: MaxFeatureBytes, Entries: MaxFeatureEntries, Layers: 1}
	if _, err := oci.Unpack(ctx, root, []oci.Layer{{Name: m.Layers[0].Digest.String(), Open: open}}, lim); err != nil {
		return "", fmt.Errorf("features: %s: %w", ref, err)
	}
	dir := f.path(digest.String())
	if err := os.Rename(root, dir); err != nil {
		if d, ok := f.cached(digest.String()); ok {
			return d, nil // fetched at the same time by another create
		}
		return "", err
	}
	return dir, nil
}

func (f *FeatureFetcher) path(digest string) string {
	return filepath.Join(f.Dir, filepath.Base(digestName(digest)))
}

// digestName is a digest as a file name: sha256-HEX.
func digestName(d string) string {
	b := []byte(d)
	for i, c := range b {
		if c == ':' || c == '/' {
			b[i] = '-'
		}
	}
	return string(b)
}

func (f *FeatureFetcher) cached(digest string) (string, bool) {
	dir := f.path(digest)
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return "", false
	}
	return dir, true
}
