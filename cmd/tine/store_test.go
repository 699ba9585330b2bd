package main

import (
	"bytes"
	"context"
	"encoding/json"
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
