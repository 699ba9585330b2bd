package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
	"tine/internal/testimage"
)

// TestImageEndToEnd drives images through the CLI and a real daemon:
// import a docker save tarball, create a sandbox over it, exec (the
// image's files, not the host's), fork, diff, the errors, ls and rm.
func TestImageEndToEnd(t *testing.T) {
	c, proj := newSandboxCLI(t)
	tarPath := filepath.Join(t.TempDir(), "bb.tar")
	testimage.WriteTarball(t, tarPath, "example.test/bb:1", testimage.BusyboxImage(t))

	var im api.Image
	if err := json.Unmarshal([]byte(c.ok("image", "import", tarPath, "--name", "bb", "--json")), &im); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(im.Digest, "sha256:") || len(im.Names) != 1 || im.Names[0] != "bb" {
		t.Fatalf("import: %+v", im)
	}
	if out := c.ok("image", "ls"); !strings.Contains(out, "bb") || !strings.Contains(out, im.Digest[7:19]) {
		t.Errorf("image ls:\n%s", out)
	}

	var sb api.Sandbox
	if err := json.Unmarshal([]byte(c.ok("create", "--from", proj, "--name", "i", "--image", "bb", "--json")), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Image == nil || sb.Image.Digest != im.Digest {
		t.Fatalf("create --image: %+v", sb.Image)
	}
	if out := c.ok("exec", "i", "--", "cat", "/etc/os-release", "/only-in-image"); out != testimage.OSRelease+"image file\n" {
		t.Errorf("cat in the image sandbox: %q", out)
	}
	// A host-only file is absent; the project is at its path.
	if _, err := os.Stat("/etc/debian_version"); err == nil {
		if _, _, code := c.run("", "exec", "i", "--", "test", "-e", "/etc/debian_version"); code == 0 {
			t.Errorf("the host's /etc/debian_version is visible in the image sandbox")
		}
	}
	if out := c.ok("exec", "i", "--", "cat", filepath.Join(proj, "hello.txt")); out != "hello\n" {
		t.Errorf("project in the image sandbox: %q", out)
	}
	if out := c.ok("exec", "i", "--", "sh", "-c", "echo $FROM_IMAGE"); out != "yes\n" {
		t.Errorf("image env: %q", out)
	}
	c.ok("exec", "i", "--", "sh", "-c", "echo changed > "+proj+"/hello.txt && echo os > /etc/motd")

	var kids []api.Sandbox
	if err := json.Unmarshal([]byte(c.ok("fork", "i", "--json")), &kids); err != nil {
		t.Fatal(err)
	}
	if len(kids) != 1 || kids[0].Image == nil || kids[0].Image.Digest != im.Digest {
		t.Fatalf("fork: %+v", kids)
	}
	if out := c.ok("exec", kids[0].Name, "--", "cat", "/only-in-image", "/etc/motd", filepath.Join(proj, "hello.txt")); out != "image file\nos\nchanged\n" {
		t.Errorf("fork of the image sandbox sees %q", out)
	}
	c.ok("exec", kids[0].Name, "--", "sh", "-c", "echo new > "+proj+"/new.txt")
	var changes []api.Change
	if err := json.Unmarshal([]byte(c.ok("diff", kids[0].Name, "--json")), &changes); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, ch := range changes {
		kinds[filepath.Base(ch.Path)] = ch.Kind
	}
	// A fork's diff starts at the fork: hello.txt changed before it.
	if len(changes) != 1 || kinds["new.txt"] != "added" {
		t.Errorf("diff of the fork: %+v", changes)
	}
	if out := c.ok("status", "i"); !strings.Contains(out, "image      bb (") {
		t.Errorf("status lacks the image:\n%s", out)
	}

	// A daemon restart keeps the image: started again, the sandbox runs
	// over it with its OS layer.
	c.stopDaemon()
	c.ok("start", "i")
	if out := c.ok("exec", "i", "--", "cat", "/only-in-image", "/etc/motd"); out != "image file\nos\n" {
		t.Errorf("after a daemon restart: %q", out)
	}

	// Errors name the image and what to do.
	if _, errOut, code := c.run("", "create", "--from", proj, "--image", "nosuch"); code == 0 || !strings.Contains(errOut, `"nosuch"`) || !strings.Contains(errOut, "tine image pull") {
		t.Errorf("create over an unknown image: exit %d, %q", code, errOut)
	}
	if _, errOut, code := c.run("", "image", "rm", "bb"); code == 0 || !strings.Contains(errOut, "sandbox i") {
		t.Errorf("rm of an image in use: exit %d, %q", code, errOut)
	}
	c.ok("rm", "-f", "i", kids[0].Name)
	var rm api.RemoveImageResponse
	if err := json.Unmarshal([]byte(c.ok("image", "rm", "bb", "--json")), &rm); err != nil || !rm.Removed {
		t.Fatalf("image rm: %+v %v", rm, err)
	}
	if out := c.ok("image", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("image ls after rm: %s", out)
	}
}
