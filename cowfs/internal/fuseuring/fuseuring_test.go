package fuseuring

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestCPUList(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "0\n", want: []int{0}},
		{in: "0-3\n", want: []int{0, 1, 2, 3}},
		{in: "0-1,4,6-7\n", want: []int{0, 1, 4, 6, 7}},
		{in: "3-1\n", bad: true},
		{in: "x\n", bad: true},
		{in: "0-99999999\n", bad: true},
	} {
		p := filepath.Join(dir, "list")
		if err := os.WriteFile(p, []byte(c.in), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := cpuList(p)
		if c.bad != (err != nil) || !slices.Equal(got, c.want) {
			t.Errorf("cpuList(%q) = %v, %v; want %v (error: %v)", c.in, got, err, c.want, c.bad)
		}
	}
}

// FuzzEntryInput checks that whatever lengths the ring header claims,
// the request handed to go-fuse lies within the entry's buffers.
func FuzzEntryInput(f *testing.F) {
	f.Add(uint32(40+16+5), uint32(16), uint32(5))
	f.Add(uint32(40), uint32(opWrite), uint32(0))
	f.Add(uint32(1<<31), uint32(1), uint32(1<<31))
	f.Fuzz(func(t *testing.T, length, opcode, payloadSize uint32) {
		mem := make([]byte, pageSize+8192)
		e := &entry{mem: mem, hdr: mem[:headerSize], payload: mem[pageSize:]}
		binary.LittleEndian.PutUint32(e.hdr[0:], length)
		binary.LittleEndian.PutUint32(e.hdr[4:], opcode)
		in, ok := e.input(length, payloadSize)
		if !ok {
			return
		}
		total := 0
		for _, b := range in {
			total += len(b)
		}
		if total != int(length) || len(in[1]) > opInSize || len(in[2]) > len(e.payload) {
			t.Fatalf("length %d payload %d: input of %d bytes (%d, %d, %d)", length, payloadSize, total, len(in[0]), len(in[1]), len(in[2]))
		}
	})
}
