// Package testimage builds small container images for tests: tar layers
// from entry lists, and a busybox image from the host's static busybox.
package testimage

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry: its header and, for a regular file, its content.
type Entry struct {
	tar.Header
	Body string
}

// File, Dir, Symlink and Hardlink make entries.
func File(name, body string, mode int64) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body))}, Body: body}
}

// Dir is a directory entry.
func Dir(name string, mode int64) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}

// Symlink is a symbolic link entry.
func Symlink(name, target string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

// Hardlink is a hard link entry.
func Hardlink(name, target string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

// Tar returns the tar stream of the entries. A header's Size is kept
// when set larger than the body (a stream that lies).
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %s: %v", h.Name, err)
		}
		if e.Body != "" {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				t.Fatalf("tar body %s: %v", h.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layer returns a layer holding the entries.
func Layer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	b := Tar(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image returns an image of the layers with the config's Env, User,
// WorkingDir and Cmd.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// Busybox is the host's static busybox, which Busybox images hold.
const Busybox = "/bin/busybox"

// OSRelease is /etc/os-release in Busybox images.
const OSRelease = "ID=tine-test\nNAME=\"tine test image\"\n"

// BusyboxImage returns a two-layer image: the host's static busybox as
// /bin/busybox with sh, cat, ls, id, env, echo and pwd linked to it,
// /etc/os-release (OSRelease), /etc/passwd with root and app (1000),
// /only-in-image, and in the second layer a whiteout of /etc/gone.
// It fails the test where there is no static busybox (make deps installs
// busybox-static).
func BusyboxImage(t testing.TB) v1.Image {
	t.Helper()
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		t.Fatalf("no static busybox at %s (apt-get install busybox-static, or make deps): %v", Busybox, err)
	}
	ents := []Entry{Dir("bin", 0o755), Dir("etc", 0o755), Dir("tmp", 0o1777), Dir("home/app", 0o755),
		File("bin/busybox", string(bb), 0o755)}
	for _, n := range []string{"sh", "cat", "ls", "id", "env", "echo", "pwd", "test", "stat", "touch", "rm"} {
		ents = append(ents, Symlink("bin/"+n, "busybox"))
	}
	ents = append(ents,
		File("etc/os-release", OSRelease, 0o644),
		File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n", 0o644),
		File("etc/group", "root:x:0:\napp:x:1000:\n", 0o644),
		File("etc/gone", "removed by the second layer\n", 0o644),
		File("only-in-image", "image file\n", 0o644))
	home := Dir("home/app", 0o755)
	home.Uid, home.Gid = 1000, 1000
	ents = append(ents, home)
	l2 := Layer(t, File("etc/.wh.gone", "", 0), File("etc/motd", "second layer\n", 0o644))
	return Image(t, v1.Config{Env: []string{"PATH=/bin", "FROM_IMAGE=yes"}, WorkingDir: "/", Cmd: []string{"sh"}},
		Layer(t, ents...), l2)
}

// WriteTarball writes img as docker save does, tagged tag.
func WriteTarball(t testing.TB, path, tag string, img v1.Image) {
	t.Helper()
	tg, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(path, tg, img); err != nil {
		t.Fatal(err)
	}
}

// WriteLayout writes img into a new OCI image layout at dir, its
// ref.name annotation ref (none if empty).
func WriteLayout(t testing.TB, dir, ref string, img v1.Image) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		t.Fatal(err)
	}
}
