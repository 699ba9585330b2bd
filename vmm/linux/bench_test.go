package linux

import "testing"

// BenchmarkLoad measures loading Debian's kernel into 512 MiB of RAM by
// each entry path: mostly the copy of the image, plus the tables.
func BenchmarkLoad(b *testing.B) {
	k, err := kernelsForBench()
	if err != nil {
		b.Skipf("Debian cloud kernel not present: %v", err)
	}
	mem := make([]byte, 512<<20)
	initrd := make([]byte, 8<<20)
	for _, tc := range []struct {
		name  string
		image []byte
	}{{"bzImage", k.bz}, {"pvh", k.elf}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.image)))
			for b.Loop() {
				if _, err := Load(mem, tc.image, Config{Cmdline: "console=ttyS0", Initrd: initrd}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
