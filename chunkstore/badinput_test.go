package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// buildDamageStore makes a small store with one pack holding compressible
// and random chunks and a node, and returns its dir, ids and contents.
func buildDamageStore(t *testing.T) (string, []ID, [][]byte) {
	t.Helper()
	dir := t.TempDir()
	s := openT(t, dir, nil)
	var ids []ID
	var datas [][]byte
	for i := range 6 {
		d := randBytes(uint64(i), 700)
		if i%2 == 0 {
			d = bytes.Repeat(d[:50], 20)
		}
		id, err := s.Put(d)
		if err != nil {
			t.Fatal(err)
		}
		ids, datas = append(ids, id), append(datas, d)
	}
	node, err := s.PutNode(ids, []byte("payload"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetRef("snapshots/x", ID{}, node); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, ids, datas
}

func onlyFile(t *testing.T, dir, sub string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, sub, "*"))
	if len(m) != 1 {
		t.Fatalf("want one file in %s, have %v", sub, m)
	}
	return m[0]
}

// TestDamagedPack truncates and flips bits in a pack: every Get returns the
// right bytes or an error naming the pack and an offset, never a panic or
// wrong data, and Verify names the damage.
func TestDamagedPack(t *testing.T) {
	dir, ids, datas := buildDamageStore(t)
	pack := onlyFile(t, dir, "packs")
	orig, err := os.ReadFile(pack)
	if err != nil {
		t.Fatal(err)
	}
	type damage struct {
		name string
		mod  func([]byte) []byte
	}
	var cases []damage
	for _, n := range []int{0, 10, packHeaderLen, packHeaderLen + 30, len(orig) / 2, len(orig) - 1} {
		cases = append(cases, damage{"truncate to " + strconv.Itoa(n), func(b []byte) []byte { return b[:n] }})
	}
	for off := 0; off < len(orig); off += 13 {
		cases = append(cases, damage{"flip byte " + strconv.Itoa(off), func(b []byte) []byte { b[off] ^= 1 << (off % 8); return b }})
	}
	for _, c := range cases {
		if err := os.WriteFile(pack, c.mod(bytes.Clone(orig)), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, nil)
		if err != nil {
			t.Fatalf("%s: Open: %v", c.name, err)
		}
		failed := 0
		for i, id := range ids {
			got, err := s.Get(id)
			if err != nil {
				if !strings.Contains(err.Error(), pack) || !strings.Contains(err.Error(), "offset") || !errors.Is(err, ErrCorrupt) {
					t.Errorf("%s: Get error does not name the pack and offset: %v", c.name, err)
				}
				failed++
				continue
			}
			if !bytes.Equal(got, datas[i]) {
				t.Fatalf("%s: Get returned wrong data for chunk %d", c.name, i)
			}
		}
		rep, err := s.Verify(context.Background())
		if err != nil {
			t.Fatalf("%s: Verify: %v", c.name, err)
		}
		if rep.OK() {
			t.Errorf("%s: Verify found nothing wrong (%d Get errors)", c.name, failed)
		}
		for _, d := range rep.Damaged {
			if d.File != pack && !strings.Contains(d.Problem, "missing object") {
				t.Errorf("%s: damage names %s, not the pack", c.name, d.File)
			}
		}
		s.Close()
	}
}

// TestDamagedIndex: a damaged index file makes Open fail with an error
// naming the file and the offset; with AllowDamaged, Verify reports it.
// (The ref log has its own test: a torn last record is not damage.)
func TestDamagedIndex(t *testing.T) {
	dir, _, _ := buildDamageStore(t)
	idx := onlyFile(t, dir, "index")
	for _, file := range []string{idx} {
		orig, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		mods := map[string]func([]byte) []byte{
			"empty":      func(b []byte) []byte { return nil },
			"truncated":  func(b []byte) []byte { return b[:len(b)-1] },
			"first byte": func(b []byte) []byte { b[0] ^= 0x10; return b },
			"middle":     func(b []byte) []byte { b[len(b)/2] ^= 0x01; return b },
			"last byte":  func(b []byte) []byte { b[len(b)-2] ^= 0x04; return b },
			"appended":   func(b []byte) []byte { return append(b, 0) },
		}
		for name, mod := range mods {
			if err := os.WriteFile(file, mod(bytes.Clone(orig)), 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := Open(dir, nil)
			if err == nil {
				s.Close()
				t.Fatalf("%s %s: Open succeeded", file, name)
			}
			if !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "offset") {
				t.Errorf("%s %s: error does not name file and offset: %v", file, name, err)
			}
			s, err = Open(dir, &Options{AllowDamaged: true})
			if err != nil {
				t.Fatalf("%s %s: Open with AllowDamaged: %v", file, name, err)
			}
			rep, err := s.Verify(context.Background())
			if err != nil || rep.OK() {
				t.Errorf("%s %s: Verify did not report the damage: %v %+v", file, name, err, rep)
			}
			s.Close()
		}
		if err := os.WriteFile(file, orig, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := openT(t, dir, nil)
	defer s.Close()
	if rep, err := s.Verify(context.Background()); err != nil || !rep.OK() {
		t.Fatalf("restored store: %v %v", err, rep.Damaged)
	}
}

// TestMissingPack: a pack the index names is gone. Open fails naming it;
// with AllowDamaged, reads fail with ErrCorrupt and Verify names the pack.
func TestMissingPack(t *testing.T) {
	dir, ids, _ := buildDamageStore(t)
	pack := onlyFile(t, dir, "packs")
	if err := os.Remove(pack); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, nil); err == nil || !strings.Contains(err.Error(), pack) {
		t.Fatalf("Open without the pack: %v; want an error naming %s", err, pack)
	}
	s, err := Open(dir, &Options{AllowDamaged: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Get(ids[0]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Get from a missing pack: %v", err)
	}
	rep, err := s.Verify(context.Background())
	if err != nil || rep.OK() {
		t.Fatalf("Verify: %v %+v", err, rep)
	}
	named := false
	for _, d := range rep.Damaged {
		named = named || d.File == pack
	}
	if !named {
		t.Fatalf("Verify does not name %s: %v", pack, rep.Damaged)
	}
}
