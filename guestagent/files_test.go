package guestagent

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestPutGetFile(t *testing.T) {
	c, root := startAgent(t)
	ctx := ctxT(t)
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	if err := os.Mkdir(filepath.Join(root, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.PutFile(ctx, "/d/f", 0o751|os.ModeSetuid, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(root, "d/f"))
	if err != nil || st.Mode()&os.ModePerm != 0o751 || st.Mode()&os.ModeSetuid == 0 || st.Size() != int64(len(data)) {
		t.Fatalf("put file: %v %v", st.Mode(), err)
	}
	var got bytes.Buffer
	info, err := c.GetFile(ctx, "d/../d/f", &got)
	if err != nil || !bytes.Equal(got.Bytes(), data) || info.Mode != 0o4751 || info.Size != int64(len(data)) {
		t.Fatalf("get: %+v %v, %d bytes", info, err, got.Len())
	}
	ents, _ := os.ReadDir(filepath.Join(root, "d"))
	if len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}
}

// TestFilesStayInRoot: "..", absolute symlinks and relative symlinks all
// resolve inside the agent's root, for get and for put.
func TestFilesStayInRoot(t *testing.T) {
	c, root := startAgent(t)
	ctx := ctxT(t)
	outside := filepath.Join(filepath.Dir(root), "outside")
	if err := os.WriteFile(outside, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Symlink(outside, filepath.Join(root, "abs"))
	os.Symlink("../outside", filepath.Join(root, "rel"))
	os.Symlink("/", filepath.Join(root, "dirlink"))
	for _, p := range []string{"../outside", "/../outside", "abs", "rel", "dirlink/../outside"} {
		var got bytes.Buffer
		if _, err := c.GetFile(ctx, p, &got); err == nil || got.Len() != 0 {
			t.Errorf("get %s: %v, %q", p, err, got.String())
		}
	}
	for _, p := range []string{"../outside", "dirlink/../outside"} {
		if err := c.PutFile(ctx, p, 0o644, strings.NewReader("x")); err != nil {
			t.Fatalf("put %s: %v", p, err) // lands inside the root
		}
	}
	if b, _ := os.ReadFile(outside); string(b) != "host secret" {
		t.Fatalf("the file outside the root was changed: %q", b)
	}
	if b, err := os.ReadFile(filepath.Join(root, "outside")); err != nil || string(b) != "x" {
		t.Fatalf("put ../outside did not land in the root: %q %v", b, err)
	}
	// A put onto a symlink replaces the link, never its target.
	if err := c.PutFile(ctx, "abs", 0o644, strings.NewReader("y")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "host secret" {
		t.Fatalf("put through a symlink reached outside: %q", b)
	}
	// A FIFO is refused without blocking; so is a directory.
	syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644)
	for p, what := range map[string]string{"fifo": "is a fifo, not a regular file", "/": "is a directory, not a regular file"} {
		if _, err := c.GetFile(ctx, p, new(bytes.Buffer)); err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("get %s: %v", p, err)
		}
	}
	if err := c.PutFile(ctx, "/", 0o644, strings.NewReader("z")); err == nil {
		t.Errorf("put / succeeded")
	}
}
