package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVMRunSnapshotRestore(t *testing.T) {
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		t.Skipf("/dev/kvm is missing or not usable: %v", err)
	} else {
		f.Close()
	}
	store := filepath.Join(t.TempDir(), "store")
	want := "hello from a tine bare guest\n"
	cases := []struct {
		args []string
		out  []string
	}{
		{[]string{"vm", "run"}, []string{want, "0\n1\n2\n3\n"}},
		{[]string{"vm", "run", "-store", store, "-ref", "vm/demo"}, []string{want, "snapshot ", "0\n1\n2\n3\n"}},
		{[]string{"vm", "restore", "-store", store, "-ref", "vm/demo"}, []string{"0\n1\n2\n3\n"}},
		{[]string{"vm", "restore", "-lazy", "-store", store, "-ref", "vm/demo"}, []string{"0\n1\n2\n3\n"}},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		if code := run(c.args, &out, &errOut); code != 0 {
			t.Fatalf("tine %s: exit %d: %s", strings.Join(c.args, " "), code, errOut.String())
		}
		for _, w := range c.out {
			if !strings.Contains(out.String(), w) {
				t.Errorf("tine %s: output lacks %q:\n%s", strings.Join(c.args, " "), w, out.String())
			}
		}
		if strings.HasPrefix(c.args[1], "restore") && strings.Contains(out.String(), "hello") {
			t.Errorf("restore ran the guest from the start:\n%s", out.String())
		}
	}
}
