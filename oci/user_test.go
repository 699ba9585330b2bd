package oci_test

import (
	"os"
	"path/filepath"
	"testing"

	"tine/oci"
)

func TestResolveUser(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nstaff:x:50:\n"), 0o644)
	for _, tc := range []struct {
		user     string
		uid, gid uint32
		err      bool
	}{
		{"", 0, 0, false}, {"app", 1000, 1001, false}, {"1000", 1000, 1001, false}, {"app:staff", 1000, 50, false},
		{"4242", 4242, 4242, false}, {"5:6", 5, 6, false}, {"nobody", 0, 0, true}, {"app:nogroup", 0, 0, true},
	} {
		uid, gid, err := oci.ResolveUser(root, tc.user)
		if (err != nil) != tc.err || uid != tc.uid || gid != tc.gid {
			t.Errorf("ResolveUser(%q) = %d, %d, %v", tc.user, uid, gid, err)
		}
	}
	// An image's /etc/passwd that is a symlink to the host's is read inside.
	other := t.TempDir()
	os.MkdirAll(filepath.Join(other, "etc"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(other, "etc/passwd.host"))
	os.Symlink(filepath.Join(root, "etc/passwd"), filepath.Join(other, "etc/passwd"))
	if _, _, err := oci.ResolveUser(other, "app"); err == nil {
		t.Errorf("a symlink out of the image reached %s", root)
	}
}
