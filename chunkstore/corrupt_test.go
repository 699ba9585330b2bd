package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// corruptStore makes a store of six refs, each naming a root node that
// links one chunk, closed cleanly (its ref log holds only the ref table),
// and returns its directory and refs.
func corruptStore(t *testing.T) (string, map[string]ID) {
	t.Helper()
	dir := t.TempDir()
	s := openT(t, dir, nil)
	want := map[string]ID{}
	for i := range 6 {
		blob, err := s.Put(bytes.Repeat([]byte(fmt.Sprintf("chunk %d ", i)), 40))
		if err != nil {
			t.Fatal(err)
		}
		root, err := s.PutNode([]ID{blob}, []byte(fmt.Sprintf("root %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("snapshots/%d", i)
		if err := s.SetRef(name, ID{}, root); err != nil {
			t.Fatal(err)
		}
		want[name] = root
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, want
}

// uncleanStore copies the store in dir0 and appends three ref frames to its
// log, left as a crash leaves them (not rewritten by Close).
func uncleanStore(t *testing.T, dir0 string, want map[string]ID) (string, map[string]ID) {
	dir := t.TempDir()
	copyDir(t, dir0, dir)
	s := openT(t, dir, nil)
	want1 := map[string]ID{}
	for n, id := range want {
		want1[n] = id
	}
	for i := range 3 {
		name := fmt.Sprintf("more/%d", i)
		if err := s.SetRef(name, ID{}, want["snapshots/0"]); err != nil {
			t.Fatal(err)
		}
		want1[name] = want["snapshots/0"]
	}
	path := filepath.Join(dir, refLogName)
	b := recordsOnly(t, path)
	s.Close()
	os.WriteFile(path, b, 0o644)
	return dir, want1
}

type corruption struct {
	class string
	mod   func([]byte) []byte
}

func flipAt(i int) func([]byte) []byte {
	return func(b []byte) []byte {
		if i < 0 {
			i += len(b)
		}
		b[i] ^= 0x10
		return b
	}
}

func cutAt(n int) func([]byte) []byte {
	return func(b []byte) []byte {
		if n < 0 {
			n += len(b)
		}
		return b[:n]
	}
}

// TestCorruption damages every metadata file of a store at every class of
// byte offset: the ref log (both headers' fields, each record copy's
// header, payload and checksum, the last and a middle record, truncation
// inside each), the index (header fields, an entry, the trailer,
// truncation) and the pack (header, a record's header and payload,
// truncation). Each time Verify reports the damage naming the file (and
// the offset), and no committed ref is lost without a report: either
// every ref reads back, or Open fails with ErrCorrupt and Recover brings
// every ref's root back. GC deletes nothing reachable.
func TestCorruption(t *testing.T) {
	dir0, want := corruptStore(t)
	logB, _ := os.ReadFile(filepath.Join(dir0, refLogName))
	tableCopy := (len(logB) - refLogStart) / 2 // one copy of the table record
	rec := refLogStart + tableCopy             // the second copy
	files := map[string][]corruption{
		refLogName: {
			{"magic", flipAt(1)}, {"version", flipAt(8)}, {"salt", flipAt(12)}, {"base", flipAt(16)},
			{"reserved", flipAt(25)}, {"header checksum", flipAt(28)},
			{"copy magic", flipAt(32 + 1)}, {"copy version", flipAt(32 + 8)}, {"copy base", flipAt(32 + 17)}, {"copy checksum", flipAt(32 + 30)},
			{"table length", flipAt(refLogStart)}, {"table length checksum", flipAt(refLogStart + 5)},
			{"table checksum", flipAt(refLogStart + 9)}, {"table sequence", flipAt(refLogStart + 12)},
			{"table payload", flipAt(refLogStart + tableCopy/2)}, {"table last byte", flipAt(rec - 1)},
			{"table copy length", flipAt(rec)}, {"table copy checksum", flipAt(rec + 10)},
			{"table copy payload", flipAt(rec + tableCopy/2)}, {"last byte", flipAt(-1)},
			{"cut in header", cutAt(20)}, {"cut in header copy", cutAt(40)}, {"cut in table", cutAt(refLogStart + 30)},
			{"cut at table copy", cutAt(rec)}, {"cut in table copy", cutAt(rec + 30)}, {"cut last byte", cutAt(-1)},
			{"empty", cutAt(0)},
		},
		"index/*": {
			{"magic", flipAt(0)}, {"version", flipAt(9)}, {"flags", flipAt(12)}, {"count", flipAt(16)},
			{"logical bytes", flipAt(25)}, {"entry id", flipAt(idxHeaderLen + 3)}, {"entry pack", flipAt(idxHeaderLen + 32)},
			{"entry offset", flipAt(idxHeaderLen + 37)}, {"entry kind", flipAt(idxHeaderLen + 52)},
			{"last entry", flipAt(-idxTrailer - 3)}, {"trailer", flipAt(-1)},
			{"cut in header", cutAt(20)}, {"cut in entries", cutAt(idxHeaderLen + 70)}, {"cut in trailer", cutAt(-1)},
		},
		"packs/*": {
			{"magic", flipAt(0)}, {"version", flipAt(8)}, {"number", flipAt(12)},
			{"record kind", flipAt(packHeaderLen)}, {"record length", flipAt(packHeaderLen + 8)},
			{"record checksum", flipAt(packHeaderLen + 12)}, {"record id", flipAt(packHeaderLen + 20)},
			{"record payload", flipAt(packHeaderLen + recHeaderLen + 3)}, {"last record", flipAt(-2)},
			{"cut in record", cutAt(packHeaderLen + 30)}, {"cut last byte", cutAt(-1)},
		},
	}
	// A log with frames appended since its last rewrite (as a crash leaves
	// it): damage to a middle and to the last frame, either copy.
	dir1, want1 := uncleanStore(t, dir0, want)
	frame := len(appendRefFrame(nil, 0, 1, []refOp{{name: "more/0", id: want["snapshots/0"]}}))
	logU, _ := os.ReadFile(filepath.Join(dir1, refLogName))
	mid, last := len(logB), len(logU)-frame
	unclean := []corruption{
		{"middle length", flipAt(mid)}, {"middle checksum", flipAt(mid + 9)}, {"middle payload", flipAt(mid + 20)},
		{"middle copy", flipAt(mid + frame/2 + 20)}, {"last length", flipAt(last + 1)}, {"last payload", flipAt(last + 20)},
		{"last checksum", flipAt(last + 8)}, {"last copy payload", flipAt(last + frame/2 + 20)}, {"last copy end", flipAt(-1)},
	}
	for _, c := range unclean {
		t.Run("unclean/"+c.class, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, dir1, dir)
			file := filepath.Join(dir, refLogName)
			b, _ := os.ReadFile(file)
			os.WriteFile(file, c.mod(b), 0o644)
			checkCorrupted(t, dir, file, want1, true)
		})
	}
	for glob, cases := range files {
		for _, c := range cases {
			t.Run(glob+"/"+c.class, func(t *testing.T) {
				dir := t.TempDir()
				copyDir(t, dir0, dir)
				m, _ := filepath.Glob(filepath.Join(dir, glob))
				if len(m) != 1 {
					t.Fatalf("%s: %v", glob, m)
				}
				file := m[0]
				b, _ := os.ReadFile(file)
				if err := os.WriteFile(file, c.mod(b), 0o644); err != nil {
					t.Fatal(err)
				}
				checkCorrupted(t, dir, file, want, glob != "packs/*")
			})
		}
	}
}

// checkCorrupted checks a store with damage in file: Verify reports it, no
// ref is lost without a report, GC deletes nothing. With metadata, Recover
// must also bring every ref's root back (damage to a pack's object loses
// that object: there is no redundancy for data).
func checkCorrupted(t *testing.T, dir, file string, want map[string]ID, metadata bool) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(dir, &Options{AllowDamaged: true})
	if err != nil {
		t.Fatalf("Open with AllowDamaged: %v", err)
	}
	rep, err := s.Verify(ctx)
	s.Close()
	reported := false
	for _, d := range rep.Damaged {
		reported = reported || d.File == file && (d.Offset >= 0 || strings.Contains(d.Problem, "offset"))
	}
	if err != nil || !reported {
		t.Fatalf("Verify did not report damage in %s: %v %v", file, err, rep.Damaged)
	}
	s, err = Open(dir, nil)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "tine store re") {
			t.Fatalf("Open: %v: want ErrCorrupt suggesting recover or rebuild-index", err)
		}
		if _, err := Recover(ctx, dir, nil); err != nil {
			t.Fatalf("Recover: %v", err)
		}
		s = openT(t, dir, nil)
	}
	refs, _ := s.ListRefs("")
	for name, id := range want {
		if refs[name] != id && (!metadata || refs["recovered/"+id.String()] != id) {
			t.Fatalf("ref %s (%s) lost: refs %v", name, short(id), refs)
		}
	}
	st, err := s.GC(ctx)
	if err == nil && st.Deleted != 0 {
		t.Fatalf("GC deleted %d objects of a store without garbage", st.Deleted)
	}
	s.Close()
	if metadata {
		if err != nil {
			t.Fatalf("GC after repair: %v", err)
		}
		s = openT(t, dir, &Options{AllowDamaged: true})
		defer s.Close()
		if rep, err := s.Verify(ctx); err != nil || !rep.OK() {
			t.Fatalf("Verify after repair: %v %v", err, rep.Damaged)
		}
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
