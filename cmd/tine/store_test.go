package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tine/chunkstore"
)

// TestStoreCommands runs tine store stats/refs/verify/gc on a real store,
// then damages a pack and checks that verify names it and fails.
func TestStoreCommands(t *testing.T) {
	dir := t.TempDir()
	s, err := chunkstore.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("tine store command test\n"), 5000)
	refs, err := s.PutStream(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	links := []chunkstore.ID{}
	for _, r := range refs {
		links = append(links, r.ID)
	}
	root, _ := s.PutNode(links, nil)
	if err := s.SetRef("snapshots/one", chunkstore.ID{}, root); err != nil {
		t.Fatal(err)
	}
	s.Put([]byte("garbage nobody links to"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"store", "stats", dir}, 0, "dedup ratio"},
		{[]string{"store", "stats", dir, "--json"}, 0, `"LogicalBytes"`},
		{[]string{"store", "refs", dir}, 0, root.String() + " snapshots/one"},
		{[]string{"store", "refs", dir, "branches/"}, 0, ""},
		{[]string{"store", "verify", dir}, 0, "0 problems"},
		{[]string{"store", "gc", dir}, 0, "deleted 1"},
		{[]string{"store", "verify", dir}, 0, "0 problems"},
		{[]string{"store", "stats"}, 2, ""},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		code := run(c.args, &out, &errOut)
		if code != c.code || !strings.Contains(out.String(), c.contains) {
			t.Fatalf("tine %s: exit %d (want %d), stdout %q (want %q), stderr %q", strings.Join(c.args, " "), code, c.code, out.String(), c.contains, errOut.String())
		}
		if strings.Contains(strings.Join(c.args, " "), "--json") {
			var st chunkstore.Stats
			if err := json.Unmarshal(out.Bytes(), &st); err != nil || st.LogicalBytes != int64(len(data))+23 {
				t.Fatalf("stats --json: %v %+v", err, st)
			}
		}
	}

	packs, _ := filepath.Glob(filepath.Join(dir, "packs", "*.pack"))
	if len(packs) != 1 {
		t.Fatalf("packs: %v", packs)
	}
	b, _ := os.ReadFile(packs[0])
	b[len(b)-5] ^= 0x40
	os.WriteFile(packs[0], b, 0o644)
	var out, errOut bytes.Buffer
	if code := run([]string{"store", "verify", dir}, &out, &errOut); code != 1 || !strings.Contains(out.String(), packs[0]) {
		t.Fatalf("verify of a damaged pack: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
}

// TestStoreCommandsNotAStore: every store command on a directory that
// holds no store fails naming it and creates nothing (verify used to
// create a store and report "0 problems").
func TestStoreCommandsNotAStore(t *testing.T) {
	parent := t.TempDir()
	empty := filepath.Join(parent, "empty")
	other := filepath.Join(parent, "other")
	os.Mkdir(empty, 0o755)
	os.Mkdir(other, 0o755)
	os.WriteFile(filepath.Join(other, "notes.txt"), []byte("hello"), 0o644)
	for _, dir := range []string{filepath.Join(parent, "nonexist-store"), empty, other} {
		for _, cmd := range []string{"verify", "gc", "recover", "rebuild-index", "stats", "refs"} {
			var out, errOut bytes.Buffer
			code := run([]string{"store", cmd, dir}, &out, &errOut)
			if code != 1 || !strings.Contains(errOut.String(), dir+" is not a tine store") {
				t.Fatalf("tine store %s %s: exit %d, stdout %q, stderr %q", cmd, dir, code, out.String(), errOut.String())
			}
		}
	}
	ents, _ := os.ReadDir(parent)
	if len(ents) != 2 {
		t.Fatalf("store commands created something in %s: %v", parent, ents)
	}
	for _, d := range []string{empty, other} {
		if ents, _ := os.ReadDir(d); len(ents) != map[string]int{empty: 0, other: 1}[d] {
			t.Fatalf("store commands wrote into %s: %v", d, ents)
		}
	}
}

// TestStoreRefLogDamage is the reported case: a store of 45 refs closed
// cleanly, then one byte of refs.log flipped or the file cut to 1500
// bytes. No ref is lost silently: verify names the file and offset and
// fails, gc deletes nothing, and recover brings every root back.
func TestStoreRefLogDamage(t *testing.T) {
	for _, damage := range []string{"flip", "truncate"} {
		t.Run(damage, func(t *testing.T) {
			dir := t.TempDir()
			s, err := chunkstore.Open(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]chunkstore.ID{}
			for i := range 45 {
				blob, _ := s.Put([]byte(fmt.Sprintf("file %d", i)))
				root, err := s.PutNode([]chunkstore.ID{blob}, []byte(fmt.Sprintf("root %d", i)))
				if err != nil {
					t.Fatal(err)
				}
				name := fmt.Sprintf("snapshots/%02d", i)
				if err := s.SetRef(name, chunkstore.ID{}, root); err != nil {
					t.Fatal(err)
				}
				want[name] = root
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			log := filepath.Join(dir, "refs.log")
			b, _ := os.ReadFile(log)
			if damage == "flip" {
				b[len(b)/3] ^= 0x08
			} else {
				b = b[:1500]
			}
			os.WriteFile(log, b, 0o644)

			var out, errOut bytes.Buffer
			if code := run([]string{"store", "verify", dir}, &out, &errOut); code != 1 || !strings.Contains(out.String(), log+" offset ") {
				t.Fatalf("verify: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
			}
			out.Reset()
			errOut.Reset()
			code := run([]string{"store", "gc", dir}, &out, &errOut)
			if damage == "truncate" && (code != 1 || !strings.Contains(errOut.String(), "tine store recover")) {
				t.Fatalf("gc of a store whose refs may be lost: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
			}
			if damage == "flip" && (code != 0 || !strings.Contains(out.String(), "deleted 0 ")) {
				t.Fatalf("gc after a flipped byte: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
			}
			out.Reset()
			if code := run([]string{"store", "recover", dir}, &out, &errOut); code != 0 {
				t.Fatalf("recover: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
			}
			out.Reset()
			if code := run([]string{"store", "verify", dir}, &out, &errOut); code != 0 {
				t.Fatalf("verify after recover: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
			}
			s, err = chunkstore.Open(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			refs, _ := s.ListRefs("")
			for name, id := range want {
				if refs[name] != id && refs["recovered/"+id.String()] != id {
					t.Fatalf("ref %s (%s) lost: refs now %v", name, id, refs)
				}
			}
			if st, err := s.GC(context.Background()); err != nil || st.Deleted != 0 {
				t.Fatalf("gc after recover: %+v %v", st, err)
			}
		})
	}
}

// TestStoreRebuildIndex: one bad byte in the index makes open fail with a
// hint; rebuild-index makes the store whole again.
func TestStoreRebuildIndex(t *testing.T) {
	dir := t.TempDir()
	s, err := chunkstore.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := s.Put([]byte("indexed"))
	node, _ := s.PutNode([]chunkstore.ID{id}, nil)
	s.SetRef("snapshots/a", chunkstore.ID{}, node)
	s.Close()
	idx, _ := filepath.Glob(filepath.Join(dir, "index", "*.idx"))
	for _, f := range idx {
		b, _ := os.ReadFile(f)
		b[40] ^= 1
		os.WriteFile(f, b, 0o644)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"store", "refs", dir}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "tine store rebuild-index") {
		t.Fatalf("refs with a damaged index: exit %d, stderr %q", code, errOut.String())
	}
	out.Reset()
	if code := run([]string{"store", "rebuild-index", "--json", dir}, &out, &errOut); code != 0 {
		t.Fatalf("rebuild-index: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	var rep chunkstore.RebuildReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Objects != 2 || rep.Packs != 1 {
		t.Fatalf("rebuild-index --json: %v %s", err, out.String())
	}
	out.Reset()
	if code := run([]string{"store", "verify", dir}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "checked 2 objects") {
		t.Fatalf("verify after rebuild: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
}
