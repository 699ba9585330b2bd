package peer

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestCleanupsRunsNewestFirstAndJoinsErrors(t *testing.T) {
	var c Cleanups
	var order []int
	for i := 0; i < 3; i++ {
		c.Add("step", func() error {
			order = append(order, i)
			if i == 1 {
				return errors.New("boom")
			}
			return nil
		})
	}
	err := c.Run()
	if !reflect.DeepEqual(order, []int{2, 1, 0}) {
		t.Errorf("order %v, want [2 1 0]", order)
	}
	if err == nil || c.Len() != 0 {
		t.Errorf("Run() = %v with %d steps left, want an error and none left", err, c.Len())
	}
	if err := c.Run(); err != nil {
		t.Errorf("second Run() = %v, want nil", err)
	}
}

func TestUnescapeMount(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/a/b", "/a/b"},
		{`/a\040b`, "/a b"},
		{`/x\011y\134z`, "/x\ty\\z"},
		{`/bad\09`, `/bad\09`},
		{`/end\`, `/end\`},
	}
	for _, tc := range tests {
		if got := unescapeMount(tc.in); got != tc.want {
			t.Errorf("unescapeMount(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestOverlayMountAndUnmount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount overlayfs")
	}
	dir := t.TempDir()
	lower := filepath.Join(dir, "lower")
	if err := os.MkdirAll(lower, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "f"), []byte("base"), 0o644); err != nil {
		t.Fatal(err)
	}
	var cl Cleanups
	o := Overlay{Lower: []string{lower}, Upper: filepath.Join(dir, "up"), Work: filepath.Join(dir, "wk"), Dir: filepath.Join(dir, "mnt")}
	if err := MountOverlay(&cl, o); err != nil {
		t.Fatal(err)
	}
	if ok, err := Mounted(o.Dir); err != nil || !ok {
		t.Fatalf("Mounted(%s) = %v, %v after mount", o.Dir, ok, err)
	}
	b, err := os.ReadFile(filepath.Join(o.Dir, "f"))
	if err != nil || string(b) != "base" {
		t.Fatalf("read through overlay: %q, %v", b, err)
	}
	if err := cl.Run(); err != nil {
		t.Fatal(err)
	}
	if ok, err := Mounted(o.Dir); err != nil || ok {
		t.Fatalf("Mounted(%s) = %v, %v after cleanup", o.Dir, ok, err)
	}
}
