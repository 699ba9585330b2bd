package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestProbe(t *testing.T) {
	mk := func(files map[string]string) string {
		root := t.TempDir()
		for p, data := range files {
			os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755)
			os.WriteFile(filepath.Join(root, p), []byte(data), 0o644)
		}
		return root
	}
	_, qemuErr := exec.LookPath("qemu-system-x86_64")
	fallback := None
	if qemuErr == nil {
		fallback = NestedOnly
	}
	cases := []struct {
		files map[string]string
		want  Support
	}{
		{map[string]string{"dev/kvm": "", "proc/cpuinfo": "flags\t: fpu vmx sse\n"}, Native},
		{map[string]string{"dev/kvm": "", "proc/cpuinfo": "flags\t: fpu svm\n"}, Native},
		{map[string]string{"dev/kvm": "", "proc/cpuinfo": "flags\t: fpu svm\n", "sys/module/kvm_pvm/x": ""}, fallback},
		{map[string]string{"dev/kvm": "", "proc/cpuinfo": "flags\t: fpu hypervisor\n"}, fallback},
		{map[string]string{"proc/cpuinfo": "flags\t: fpu vmx\n"}, fallback},
	}
	for i, c := range cases {
		if got := probeAt(mk(c.files)); got.Support != c.want || got.Detail == "" {
			t.Errorf("case %d: %+v, want %s", i, got, c.want)
		}
	}
	t.Logf("this host: %+v", Probe())
}
