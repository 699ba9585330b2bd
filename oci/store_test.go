package oci_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"tine/internal/testimage"
	"tine/oci"
)

func openStore(t *testing.T) *oci.Store {
	t.Helper()
	s, err := oci.Open(filepath.Join(t.TempDir(), "images"), oci.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkBusybox checks an unpacked BusyboxImage.
func checkBusybox(t *testing.T, im *oci.Image) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(im.Rootfs, "etc/os-release"))
	if err != nil || string(b) != testimage.OSRelease {
		t.Fatalf("etc/os-release: %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(im.Rootfs, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("etc/gone, whited out by layer 2, is there: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(im.Rootfs, "etc/motd")); err != nil || string(b) != "second layer\n" {
		t.Errorf("etc/motd: %q, %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(im.Rootfs, "bin/sh")); err != nil || l != "busybox" {
		t.Errorf("bin/sh: %q, %v", l, err)
	}
	st, err := os.Stat(filepath.Join(im.Rootfs, "home/app"))
	if err != nil || st.Sys().(*syscallStat).Uid != 1000 {
		t.Errorf("home/app not owned by 1000: %v", err)
	}
	if got := strings.Join(im.Config.Env, " "); got != "PATH=/bin FROM_IMAGE=yes" {
		t.Errorf("config env %q", got)
	}
	if im.Layers != 2 || im.Platform != "linux/amd64" {
		t.Errorf("layers %d platform %q", im.Layers, im.Platform)
	}
}

func TestImportTarball(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	img := testimage.BusyboxImage(t)
	tb := filepath.Join(t.TempDir(), "bb.tar")
	testimage.WriteTarball(t, tb, "example.test/busybox:1", img)
	im, err := s.Import(ctx, tb, "")
	if err != nil {
		t.Fatal(err)
	}
	checkBusybox(t, im)
	if len(im.Names) != 1 || im.Names[0] != "example.test/busybox:1" {
		t.Errorf("names %q", im.Names)
	}
	if !strings.HasPrefix(im.Rootfs, s.Dir()) || !strings.Contains(im.Rootfs, strings.TrimPrefix(im.Digest, "sha256:")) {
		t.Errorf("rootfs %s not under %s keyed by %s", im.Rootfs, s.Dir(), im.Digest)
	}
	// Found by name, by digest and by a digest prefix.
	for _, ref := range []string{"example.test/busybox:1", im.Digest, strings.TrimPrefix(im.Digest, "sha256:")[:12]} {
		got, err := s.Get(ref)
		if err != nil || got.Digest != im.Digest {
			t.Errorf("Get(%s): %v, %v", ref, got, err)
		}
	}
	// Imported again under another name: the same image, two names.
	im2, err := s.Import(ctx, tb, "mine")
	if err != nil || im2.Digest != im.Digest || len(im2.Names) != 2 {
		t.Fatalf("second import: %+v, %v", im2, err)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 {
		t.Fatalf("List: %d images, %v", len(list), err)
	}
	// Removing one name keeps the image; the last removes it.
	if _, err := s.Remove("mine"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(im.Rootfs); err != nil {
		t.Fatalf("rootfs gone after removing one of two names: %v", err)
	}
	if _, err := s.Remove("example.test/busybox:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(im.Rootfs); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("rootfs kept after removing the image: %v", err)
	}
	if _, err := s.Get("mine"); !errors.Is(err, oci.ErrNotFound) {
		t.Fatalf("Get after Remove: %v", err)
	}
	ents, _ := os.ReadDir(s.Dir())
	if len(ents) != 0 {
		t.Errorf("store not empty after removal: %v", ents)
	}
}

func TestImportLayout(t *testing.T) {
	s := openStore(t)
	dir := filepath.Join(t.TempDir(), "layout")
	testimage.WriteLayout(t, dir, "bb", testimage.BusyboxImage(t))
	im, err := s.Import(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	checkBusybox(t, im)
	if len(im.Names) != 1 || im.Names[0] != "bb" {
		t.Errorf("names %q", im.Names)
	}
}

func TestImportRefusesNonImage(t *testing.T) {
	s := openStore(t)
	f := filepath.Join(t.TempDir(), "junk.tar")
	os.WriteFile(f, []byte("not a tarball"), 0o600)
	if _, err := s.Import(context.Background(), f, ""); err == nil || !strings.Contains(err.Error(), f) {
		t.Fatalf("import of junk: %v", err)
	}
	if _, err := s.Import(context.Background(), t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "OCI image layout") {
		t.Fatalf("import of an empty directory: %v", err)
	}
}

func TestPull(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	img := testimage.BusyboxImage(t)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/busybox:v1"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	im, err := s.Pull(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	checkBusybox(t, im)
	want, _ := img.Digest()
	if im.Digest != want.String() {
		t.Errorf("digest %s, pushed %s", im.Digest, want)
	}
	if _, err := s.Pull(context.Background(), strings.TrimPrefix(srv.URL, "http://")+"/test/missing:v1"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("pull of a missing image: %v", err)
	}
}

// A crash while unpacking leaves only a temporary directory, which Open
// removes.
func TestOpenRemovesHalfMade(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	os.MkdirAll(filepath.Join(dir, ".tmp-0123/rootfs/etc"), 0o700)
	s, err := oci.Open(dir, oci.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(s.Dir()); len(ents) != 0 {
		t.Fatalf("left after Open: %v", ents)
	}
}
