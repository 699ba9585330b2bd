package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/internal/testimage"
	"tine/oci"
	"tine/sandbox"
)

// imageFor unpacks the test busybox image into a store beside e's state
// and returns it as a sandbox image running as user.
func (e *env) imageFor(user string) (*sandbox.Image, []string) {
	e.t.Helper()
	s, err := oci.Open(filepath.Join(filepath.Dir(e.root), "images"), oci.Limits{})
	if err != nil {
		e.t.Fatal(err)
	}
	im, err := s.Add(context.Background(), testimage.BusyboxImage(e.t), "bb")
	if err != nil {
		e.t.Fatal(err)
	}
	si := &sandbox.Image{Ref: "bb", Digest: im.Digest, Rootfs: im.Rootfs, User: user}
	if user != "" {
		uid, gid, err := oci.ResolveUser(im.Rootfs, user)
		if err != nil {
			e.t.Fatal(err)
		}
		si.UID, si.GID = &uid, &gid
	}
	return si, im.Config.Env
}

func TestImageSandbox(t *testing.T) {
	for _, userns := range []bool{true, false} {
		t.Run(map[bool]string{true: "userns", false: "no-userns"}[userns], func(t *testing.T) {
			e := newEnv(t, 0)
			e.rt.UseUserns(userns)
			img, env := e.imageFor("")
			ctx := context.Background()
			info, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "img", Dir: e.project, Image: img, ImageEnv: env,
				Env: []string{"FROM_IMAGE=overridden", "MINE=1"}})
			if err != nil {
				t.Fatal(err)
			}
			if info.Image == nil || info.Image.Digest != img.Digest {
				t.Fatalf("info.Image %+v", info.Image)
			}
			out, code := e.sh("img", "cat /etc/os-release; cat /only-in-image; test -e /etc/debian_version && echo HOST; cat src/main.txt; echo $PATH $FROM_IMAGE $MINE")
			want := testimage.OSRelease + "image file\nv1\n/bin overridden 1\n"
			if code != 0 || out != want {
				t.Fatalf("in the image sandbox: code %d, output %q, want %q", code, out, want)
			}
			// Writes to the OS layer stay in the sandbox's layer, not the image.
			if out, code := e.sh("img", "echo mine > /etc/motd && echo p > src/new.txt"); code != 0 {
				t.Fatalf("write: %d %s", code, out)
			}
			if b, _ := os.ReadFile(filepath.Join(img.Rootfs, "etc/motd")); string(b) != "second layer\n" {
				t.Fatalf("the image's rootfs changed: etc/motd %q", b)
			}
			forks, err := e.m.Fork(ctx, "img", sandbox.ForkOptions{N: 1})
			if err != nil {
				t.Fatal(err)
			}
			if forks[0].Image == nil || forks[0].Image.Digest != img.Digest {
				t.Fatalf("fork's image %+v", forks[0].Image)
			}
			if out, _ := e.sh(forks[0].Name, "cat /etc/motd /only-in-image src/new.txt"); out != "mine\nimage file\np\n" {
				t.Fatalf("fork sees %q", out)
			}
			snap, err := e.m.Snapshot(ctx, "img", sandbox.SnapshotOptions{Name: "s1"})
			if err != nil {
				t.Fatal(err)
			}
			e.sh("img", "echo later > /etc/motd")
			if err := e.m.Rollback(ctx, "img", snap.ID); err != nil {
				t.Fatal(err)
			}
			if out, _ := e.sh("img", "cat /etc/motd /only-in-image"); out != "mine\nimage file\n" {
				t.Fatalf("after rollback: %q", out)
			}
			// Stopped and started again (as after a daemon restart): the image stays.
			if err := e.m.Stop(ctx, "img"); err != nil {
				t.Fatal(err)
			}
			if err := e.m.Start(ctx, "img"); err != nil {
				t.Fatal(err)
			}
			if out, _ := e.sh("img", "cat /only-in-image"); out != "image file\n" {
				t.Fatalf("after restart: %q", out)
			}
		})
	}
}

func TestImageUser(t *testing.T) {
	e := newEnv(t, 0)
	img, env := e.imageFor("app")
	img.Workdir = "/home/app"
	if _, err := e.m.Create(context.Background(), sandbox.CreateOptions{Name: "u", Dir: e.project, Image: img, ImageEnv: env}); err != nil {
		t.Fatal(err)
	}
	if out, _ := e.sh("u", "id -u; id -g; pwd"); strings.Fields(out)[0] != "1000" || !strings.HasSuffix(out, "/home/app\n") {
		t.Fatalf("user and directory: %q", out)
	}
}

// A sandbox whose image was removed from the store says so at start.
func TestImageGone(t *testing.T) {
	e := newEnv(t, 0)
	img, _ := e.imageFor("")
	img.Rootfs = filepath.Join(t.TempDir(), "gone")
	_, err := e.m.Create(context.Background(), sandbox.CreateOptions{Name: "g", Dir: e.project, Image: img})
	if err == nil || !strings.Contains(err.Error(), "gone from the image store") {
		t.Fatalf("create over a missing rootfs: %v", err)
	}
}
