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

func TestUpdateRefs(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	x, _ := s.Put([]byte("x"))
	y, _ := s.Put([]byte("y"))
	var zero ID
	absent := Sum([]byte("absent"))
	steps := []struct {
		name    string
		ups     []RefUpdate
		wantErr error  // nil: success
		errRef  string // the ref the error must name
	}{
		{"create two", []RefUpdate{{"a", zero, x}, {"b", zero, y}}, nil, ""},
		{"one conflict undoes all", []RefUpdate{{"c", zero, x}, {"b", x, x}}, ErrConflict, "b"},
		{"swap", []RefUpdate{{"a", x, y}, {"b", y, x}}, nil, ""},
		{"delete absent", []RefUpdate{{"a", y, x}, {"zz", x, zero}}, ErrNotFound, "zz"},
		{"missing object", []RefUpdate{{"d", zero, absent}}, ErrNotFound, "d"},
		{"name twice", []RefUpdate{{"d", zero, x}, {"d", zero, y}}, errAny, "d"},
		{"ref under a ref", []RefUpdate{{"a/b", zero, x}}, errAny, "a/b"},
		{"delete and move below", []RefUpdate{{"a", y, zero}, {"a/b", zero, x}}, nil, ""},
		{"ref over refs", []RefUpdate{{"a", zero, x}}, errAny, "a"},
		{"bad name", []RefUpdate{{"ok", zero, x}, {"../x", zero, x}}, errAny, "../x"},
		{"set and delete", []RefUpdate{{"c", zero, y}, {"b", x, zero}}, nil, ""},
	}
	for _, st := range steps {
		before, _ := s.ListRefs("")
		err := s.UpdateRefs(st.ups...)
		if st.wantErr == nil {
			if err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			continue
		}
		if err == nil || (st.wantErr != errAny && !errors.Is(err, st.wantErr)) || !strings.Contains(err.Error(), st.errRef) {
			t.Fatalf("%s: error %v, want %v naming %s", st.name, err, st.wantErr, st.errRef)
		}
		if after, _ := s.ListRefs(""); !equalRefs(before, after) {
			t.Fatalf("%s: failed update changed refs: %v -> %v", st.name, before, after)
		}
	}
	want := map[string]ID{"a/b": x, "c": y}
	if got, _ := s.ListRefs(""); !equalRefs(got, want) {
		t.Fatalf("refs %v, want %v", got, want)
	}
	s.Close()
	s = openT(t, dir, nil)
	defer s.Close()
	if got, _ := s.ListRefs(""); !equalRefs(got, want) {
		t.Fatalf("after reopen: refs %v, want %v", got, want)
	}
}

var errAny = errors.New("any error")

func equalRefs(a, b map[string]ID) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// refLogStore makes a store whose ref log holds four records and returns
// its directory, the refs after the third record and after the fourth.
func refLogStore(t *testing.T) (dir string, three, four map[string]ID) {
	dir = t.TempDir()
	s := openT(t, dir, nil)
	x, _ := s.Put([]byte("x"))
	y, _ := s.Put([]byte("y"))
	// Close and reopen: the objects go to an index file, so that the log
	// holds ref records only (and Close leaves it as it is).
	s.Close()
	s = openT(t, dir, nil)
	for _, u := range [][]RefUpdate{
		{{"a", ID{}, x}},
		{{"b", ID{}, y}, {"c", ID{}, x}},
		{{"a", x, y}},
	} {
		if err := s.UpdateRefs(u...); err != nil {
			t.Fatal(err)
		}
	}
	three, _ = s.ListRefs("")
	if err := s.UpdateRefs(RefUpdate{"c", x, ID{}}, RefUpdate{"d", ID{}, y}); err != nil {
		t.Fatal(err)
	}
	four, _ = s.ListRefs("")
	// Keep the log as the updates left it (Close rewrites it), as a
	// crash would.
	path := filepath.Join(dir, refLogName)
	unclean := recordsOnly(t, path)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, unclean, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, three, four
}

// recordsOnly returns the ref log at path up to the end of its records,
// checking that only the zeros written ahead of them follow (refLogAhead).
func recordsOnly(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeRefLog(path, b)
	if len(r.damage) != 0 || r.good > int64(len(b)) || !allZero(b[r.good:]) {
		t.Fatalf("ref log %s: damage %v, records end at %d of %d bytes, followed by more than zeros", path, r.damage, r.good, len(b))
	}
	return b[:r.good]
}

// TestRefLogWrittenAhead: a growing log is written with zeros past its new
// frame, so that the next frames land on written blocks and the file keeps
// its size (an fdatasync of data only); a crash then leaves the zeros,
// which Open takes for the end of the log, and the next update writes over
// them without cutting the file.
func TestRefLogWrittenAhead(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	x, _ := s.Put([]byte("x"))
	// Close and reopen: x goes to an index file, so that the log holds
	// ref records only and no checkpoint rewrites it below.
	s.Close()
	s = openT(t, dir, nil)
	path := filepath.Join(dir, refLogName)
	var size int64
	for i := range 20 {
		if err := s.UpdateRefs(RefUpdate{fmt.Sprintf("r%d", i), ID{}, x}); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			size = st.Size()
		} else if i > 1 && st.Size() != size {
			t.Fatalf("update %d changed the log's size from %d to %d: every update grows the file", i, size, st.Size())
		}
	}
	if recs := int64(len(recordsOnly(t, path))); size < recs+refLogAhead/2 {
		t.Fatalf("log of %d bytes for %d bytes of records: nothing written ahead", size, recs)
	}
	// A crash: the log as it is, zeros and all, before Close rewrites it.
	crashed, _ := os.ReadFile(path)
	s.Close()
	os.WriteFile(path, crashed, 0o644)
	s, err := Open(dir, &Options{AllowDamaged: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := s.Verify(context.Background()); err != nil || !rep.OK() {
		t.Fatalf("zeros written ahead reported as damage: %v %v", err, rep.Damaged)
	}
	s.Close()
	os.WriteFile(path, crashed, 0o644)
	s = openT(t, dir, nil)
	if err := s.UpdateRefs(RefUpdate{"after", ID{}, x}); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Size() != size {
		t.Fatalf("the first update after the crash cut the log from %d to %d bytes", size, st.Size())
	}
	crashed, _ = os.ReadFile(path)
	s.Close()
	os.WriteFile(path, crashed, 0o644)
	s = openT(t, dir, nil)
	defer s.Close()
	if got, _ := s.ListRefs(""); len(got) != 21 || got["after"] != x || got["r19"] != x {
		t.Fatalf("refs after two crashes: %v", got)
	}
}

// TestRefLogTornTail: a crash while a frame is written leaves part of it
// (or the file grown by zeros): Open keeps its record if the first copy is
// whole and drops it otherwise, without reporting damage, and the next
// update replaces the torn bytes.
func TestRefLogTornTail(t *testing.T) {
	dir, three, four := refLogStore(t)
	path := filepath.Join(dir, refLogName)
	orig := recordsOnly(t, path)
	r := decodeRefLog(path, orig)
	if len(r.damage) != 0 || r.good != int64(len(orig)) || len(r.recs) != 4 || r.seq != 4 {
		t.Fatalf("decode: %d records, %d of %d bytes, damage %v", len(r.recs), r.good, len(orig), r.damage)
	}
	last := len(appendRefFrame(nil, 0, 3, r.recs[3]))
	cases := []struct {
		name string
		data []byte
		want map[string]ID
	}{
		{"whole", orig, four},
		{"zeros appended", append(bytes.Clone(orig), make([]byte, 100)...), four},
		{"zeros written ahead", append(bytes.Clone(orig), make([]byte, refLogAhead)...), four},
		{"copy cut, then zeros written ahead", append(bytes.Clone(orig[:len(orig)-3]), make([]byte, refLogAhead)...), four},
		{"first copy cut, then zeros written ahead", append(bytes.Clone(orig[:len(orig)-last/2-3]), make([]byte, refLogAhead)...), three},
		{"garbage appended", append(bytes.Clone(orig), "\x05\x00\x00\x00junkjunk"...), four},
		{"copy cut in its body", orig[:len(orig)-3], four},
		{"copy not begun", orig[:len(orig)-last/2], four},
		{"copy cut in its header", orig[:len(orig)-last/2+5], four},
		{"copy zeroed", append(bytes.Clone(orig[:len(orig)-last/2]), make([]byte, last/2)...), four},
		{"first copy cut in its body", orig[:len(orig)-last/2-3], three},
		{"first copy cut in its header", orig[:len(orig)-last+5], three},
		{"frame zeroed", append(bytes.Clone(orig[:len(orig)-last]), make([]byte, last)...), three},
	}
	for _, c := range cases {
		if err := os.WriteFile(path, c.data, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, &Options{AllowDamaged: true})
		if err != nil {
			t.Fatalf("%s: Open: %v", c.name, err)
		}
		if rep, err := s.Verify(context.Background()); err != nil || !rep.OK() {
			t.Fatalf("%s: a torn write reported as damage: %v %v", c.name, err, rep.Damaged)
		}
		s.Close()
		s = openT(t, dir, nil)
		if got, _ := s.ListRefs(""); !equalRefs(got, c.want) {
			t.Fatalf("%s: refs %v, want %v", c.name, got, c.want)
		}
		// An update after a torn tail must survive the next open, and
		// leave a log with every record and its copy.
		x, _ := s.Put([]byte("x"))
		if err := s.UpdateRefs(RefUpdate{"e", ID{}, x}); err != nil {
			t.Fatalf("%s: update: %v", c.name, err)
		}
		b, _ := os.ReadFile(path)
		if r := decodeRefLog(path, b); len(r.damage) != 0 || r.fix != nil || r.good > int64(len(b)) || !allZero(b[r.good:]) {
			t.Fatalf("%s: log after the update: damage %v, fix %d bytes, %d of %d bytes", c.name, r.damage, len(r.fix), r.good, len(b))
		}
		s.Close()
		s = openT(t, dir, nil)
		got, _ := s.ListRefs("")
		if got["e"] != x || len(got) != len(c.want)+1 {
			t.Fatalf("%s: after an update and reopen: refs %v", c.name, got)
		}
		if rep, err := s.Verify(context.Background()); err != nil || !rep.OK() {
			t.Fatalf("%s: Verify: %v %v", c.name, err, rep.Damaged)
		}
		s.Close()
		os.WriteFile(path, orig, 0o644)
	}
}

func flipByte(b []byte, i int) []byte {
	b = bytes.Clone(b)
	b[i] ^= 0x20
	return b
}

// TestRefLogDamage: damage anywhere in the log is reported with the file
// and offset. Damage one copy covers loses nothing: Open reads the copy and
// rewrites the log. Damage to both copies, or a lost frame, fails Open
// (suggesting recover); with AllowDamaged, Verify reports it, the log is
// left as it is, and GC refuses to run.
func TestRefLogDamage(t *testing.T) {
	dir, _, four := refLogStore(t)
	path := filepath.Join(dir, refLogName)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeRefLog(path, orig)
	frame := func(i int) int { return len(appendRefFrame(nil, 0, uint64(i), r.recs[i])) }
	first := refLogStart
	third := first + frame(0) + frame(1)
	cases := []struct {
		name string
		data []byte
		lost bool
		off  int64
	}{
		{"empty", nil, true, 0},
		{"magic", flipByte(orig, 0), false, 0},
		{"version of the copy", flipByte(orig, refLogHeaderLen+8), false, refLogHeaderLen},
		{"salt", flipByte(orig, 13), false, 0},
		{"base", flipByte(orig, 17), false, 0},
		{"header checksum", flipByte(orig, 29), false, 0},
		{"both magics", flipByte(flipByte(orig, 0), refLogHeaderLen), true, 0},
		{"first record length", flipByte(orig, first), false, int64(first)},
		{"first record body", flipByte(orig, first+refRecHeaderLen+3), false, int64(first)},
		{"first record copy", flipByte(orig, first+frame(0)/2+refRecHeaderLen+3), false, int64(first + frame(0)/2)},
		{"third record checksum", flipByte(orig, third+9), false, int64(third)},
		{"both copies of the third record", flipByte(flipByte(orig, third+14), third+frame(2)/2+14), true, int64(third)},
		{"third frame gone", append(bytes.Clone(orig[:third]), orig[third+frame(2):]...), true, int64(third)},
		{"last record", flipByte(orig, len(orig)-frame(3)+20), false, int64(len(orig) - frame(3))},
	}
	for _, c := range cases {
		if err := os.WriteFile(path, c.data, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, &Options{AllowDamaged: true})
		if err != nil {
			t.Fatalf("%s: Open with AllowDamaged: %v", c.name, err)
		}
		rep, err := s.Verify(context.Background())
		if err != nil || !reportsAt(rep, path, c.off) {
			t.Errorf("%s: Verify did not report damage at %s offset %d: %v %v", c.name, path, c.off, err, rep.Damaged)
		}
		_, gcErr := s.GC(context.Background())
		s.Close()
		if after, _ := os.ReadFile(path); !bytes.Equal(after, c.data) {
			t.Fatalf("%s: opening with AllowDamaged changed the ref log", c.name)
		}
		s, err = Open(dir, nil)
		if c.lost {
			if err == nil {
				s.Close()
				t.Fatalf("%s: Open succeeded", c.name)
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "offset") || !strings.Contains(err.Error(), "tine store recover") {
				t.Fatalf("%s: error %v does not wrap ErrCorrupt naming file, offset and recover", c.name, err)
			}
			if gcErr == nil || !strings.Contains(gcErr.Error(), "recover") {
				t.Fatalf("%s: GC ran on a store whose refs may be lost: %v", c.name, gcErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: Open: %v", c.name, err)
		}
		if got, _ := s.ListRefs(""); !equalRefs(got, four) {
			t.Fatalf("%s: refs %v, want %v", c.name, got, four)
		}
		s.Close()
		// Open mended the log: a later verify is clean.
		s = openT(t, dir, &Options{AllowDamaged: true})
		if rep, err := s.Verify(context.Background()); err != nil || !rep.OK() {
			t.Fatalf("%s: after the log was mended: %v %v", c.name, err, rep.Damaged)
		}
		s.Close()
		os.WriteFile(path, orig, 0o644)
	}
}

// reportsAt reports whether rep lists damage in file at offset off.
func reportsAt(rep VerifyReport, file string, off int64) bool {
	for _, d := range rep.Damaged {
		if d.File == file && d.Offset == off {
			return true
		}
	}
	return false
}

// TestRefLogCompaction: when the log grows past its threshold, the next
// update rewrites it as one record holding the live refs.
func TestRefLogCompaction(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	x, _ := s.Put([]byte("x"))
	y, _ := s.Put([]byte("y"))
	s.mu.Lock()
	s.refLogCompactAt = 2000
	s.mu.Unlock()
	path := filepath.Join(dir, refLogName)
	cur, compactions, lastSize := ID{}, 0, int64(0)
	for i := range 100 {
		next := x
		if i%2 == 1 {
			next = y
		}
		if err := s.UpdateRefs(RefUpdate{"r", cur, next}, RefUpdate{"keep/" + string(rune('a'+i%26)), ID{}, x}); err != nil && i < 26 {
			t.Fatal(err)
		} else if err != nil {
			// keep/X exists from an earlier round: move r alone.
			if err := s.SetRef("r", cur, next); err != nil {
				t.Fatal(err)
			}
		}
		cur = next
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() < lastSize {
			compactions++
		}
		lastSize = st.Size()
	}
	if compactions == 0 {
		t.Fatalf("log never compacted (size %d)", lastSize)
	}
	want, _ := s.ListRefs("")
	s.Close()
	s = openT(t, dir, nil)
	defer s.Close()
	if got, _ := s.ListRefs(""); !equalRefs(got, want) || len(got) != 27 {
		t.Fatalf("after compactions and reopen: %d refs, want %d", len(got), len(want))
	}
}

// TestRefFilesMoveIntoLog: a format 1 store (one file per ref under
// refs/) opens with its refs, which move into the ref log.
func TestRefFilesMoveIntoLog(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	x, _ := s.Put([]byte("x"))
	y, _ := s.Put([]byte("y"))
	s.Close()
	// Turn it into a format 1 store.
	old := map[string]ID{"snapshots/a": x, "snapshots/b": y, "head": x}
	for n, id := range old {
		p := filepath.Join(dir, "refs", filepath.FromSlash(n))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, encodeRef(n, id), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Remove(filepath.Join(dir, refLogName))
	os.WriteFile(filepath.Join(dir, markerName), []byte(markerTextV1), 0o644)

	for round := range 2 {
		s = openT(t, dir, nil)
		if got, _ := s.ListRefs(""); !equalRefs(got, old) {
			t.Fatalf("round %d: refs %v, want %v", round, got, old)
		}
		if _, err := os.Stat(filepath.Join(dir, "refs")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("round %d: refs/ still there: %v", round, err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, markerName)); string(b) != markerText {
			t.Fatalf("round %d: marker %q", round, b)
		}
		s.Close()
	}
	// A crash after the log was written but before the old files went:
	// the log wins over stale files.
	os.MkdirAll(filepath.Join(dir, "refs", "snapshots"), 0o755)
	os.WriteFile(filepath.Join(dir, "refs", "snapshots", "a"), encodeRef("snapshots/a", y), 0o644)
	s = openT(t, dir, nil)
	defer s.Close()
	if got, _ := s.ListRefs(""); !equalRefs(got, old) {
		t.Fatalf("with stale ref files: refs %v, want %v", got, old)
	}
}

// TestJournalReplay: a ref update journals the objects put before it in
// the ref log, while their pack bytes may still sit in memory. A copy of
// the store taken right then (as a crash would leave it) opens with every
// object readable: Open writes them into their packs from the log.
func TestJournalReplay(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	defer s.Close()
	var ids []ID
	var datas [][]byte
	for i := range 20 {
		d := randBytes(uint64(i), 20000)
		id, err := s.Put(d)
		if err != nil {
			t.Fatal(err)
		}
		ids, datas = append(ids, id), append(datas, d)
	}
	node, err := s.PutNode(ids, []byte("n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetRef("head", ID{}, node); err != nil {
		t.Fatal(err)
	}
	crashed := t.TempDir()
	packBytes := int64(0)
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.Name() == "lock" {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(crashed, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(p, ".pack") {
			packBytes += int64(len(b))
		}
		os.MkdirAll(filepath.Dir(filepath.Join(crashed, rel)), 0o755)
		return os.WriteFile(filepath.Join(crashed, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	if packBytes >= 20*20000 {
		t.Fatalf("pack bytes were written before the ref update returned (%d): nothing to replay", packBytes)
	}
	c := openT(t, crashed, nil)
	defer c.Close()
	if got, err := c.GetRef("head"); err != nil || got != node {
		t.Fatalf("head = %s, %v", got, err)
	}
	for i, id := range ids {
		if b, err := c.Get(id); err != nil || !bytes.Equal(b, datas[i]) {
			t.Fatalf("object %d after replay: %v", i, err)
		}
	}
	if rep, err := c.Verify(context.Background()); err != nil || !rep.OK() {
		t.Fatalf("Verify after replay: %v %v", err, rep.Damaged)
	}
	// The replay moved the objects into an index file and emptied the log
	// of them: a second open finds them without it.
	c.Close()
	c = openT(t, crashed, nil)
	if _, err := c.Get(ids[7]); err != nil {
		t.Fatal(err)
	}
}

// TestRefLogCraftedObject: object bytes are journaled verbatim in the ref
// log, so a sandbox may write bytes shaped like a log record. Such bytes
// inside a torn last record must not pass for a valid record after it:
// the per-log salt in the checksums keeps them from matching.
func TestRefLogCraftedObject(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	x, _ := s.Put([]byte("x"))
	s.Close()
	s = openT(t, dir, nil)
	if err := s.SetRef("a", ID{}, x); err != nil {
		t.Fatal(err)
	}
	evil := []refOp{{name: "evil", id: x}}
	data := randBytes(77, 8192)
	var marks []int
	for _, salt := range []uint32{0, 1, 0x5eed} {
		rec := appendRefRecord(nil, salt, true, 1, evil)
		at := 1000 + len(marks)*2000
		copy(data[at:], rec)
		marks = append(marks, at)
	}
	obj, err := s.Put(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetRef("b", ID{}, obj); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, refLogName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, appendRefRecord(nil, 0, true, 1, evil)) {
		t.Fatal("the crafted bytes are not in the log verbatim: test does not test")
	}
	s.Close() // (it rewrites the log; the torn copy below replaces it)
	// Tear the last record between the crafted records.
	cut := bytes.Index(b, appendRefRecord(nil, 1, true, 1, evil)) + 10
	if err := os.WriteFile(path, b[:cut], 0o644); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, nil)
	if err != nil {
		t.Fatalf("Open after a torn record holding crafted bytes: %v", err)
	}
	defer s2.Close()
	got, _ := s2.ListRefs("")
	if len(got) != 1 || got["a"] != x {
		t.Fatalf("refs %v, want only a", got)
	}
}

// BenchmarkSetRef measures one durable ref update with nothing pending
// (one record, one fdatasync) and with a 4 KiB chunk put before it (the
// chunk journaled in the same record).
func BenchmarkSetRef(b *testing.B) {
	for _, put := range []bool{false, true} {
		name := "refonly"
		if put {
			name = "put4k"
		}
		b.Run(name, func(b *testing.B) {
			s := openT(b, b.TempDir(), nil)
			defer s.Close()
			cur, _ := s.Put([]byte("first"))
			if err := s.SetRef("r", ID{}, cur); err != nil {
				b.Fatal(err)
			}
			ids := []ID{cur, Sum(nil)}
			ids[1], _ = s.Put([]byte("second"))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				next := ids[i%2]
				if next == cur {
					next = ids[(i+1)%2]
				}
				if put {
					id, err := s.Put(randBytes(uint64(i), 4096))
					if err != nil {
						b.Fatal(err)
					}
					next = id
				}
				if err := s.SetRef("r", cur, next); err != nil {
					b.Fatal(err)
				}
				cur = next
			}
		})
	}
}

// TestRefLogFormat2Opens: a format 2 store (one header, records without
// sequence numbers or copies) opens with its refs; Open rewrites its log
// in format 3 and updates the marker, and AllowDamaged leaves it as it is.
func TestRefLogFormat2Opens(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	x, _ := s.Put([]byte("x"))
	y, _ := s.Put([]byte("y"))
	s.Close()
	path := filepath.Join(dir, refLogName)
	old := v2Log(0x1234, [][]refOp{{{name: "a", id: x}}, {{name: "b", id: y}, {name: "a"}}, {{name: "c", id: x}}})
	os.WriteFile(path, old, 0o644)
	os.WriteFile(filepath.Join(dir, markerName), []byte(markerTextV2), 0o644)
	want := map[string]ID{"b": y, "c": x}

	s = openT(t, dir, &Options{AllowDamaged: true})
	if got, _ := s.ListRefs(""); !equalRefs(got, want) {
		t.Fatalf("AllowDamaged: refs %v, want %v", got, want)
	}
	s.Close()
	if b, _ := os.ReadFile(path); !bytes.Equal(b, old) {
		t.Fatal("AllowDamaged changed a format 2 log")
	}
	s = openT(t, dir, nil)
	if got, _ := s.ListRefs(""); !equalRefs(got, want) {
		t.Fatalf("refs %v, want %v", got, want)
	}
	s.Close()
	b, _ := os.ReadFile(path)
	if r := decodeRefLog(path, b); r.version != refLogVersion || len(r.damage) != 0 {
		t.Fatalf("log after open: version %d, damage %v", r.version, r.damage)
	}
	if m, _ := os.ReadFile(filepath.Join(dir, markerName)); string(m) != markerText {
		t.Fatalf("marker %q", m)
	}
}
