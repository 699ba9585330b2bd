package cowfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// promoteInto is the one call of Promote in the crash tests.
func promoteInto(ctx context.Context, f *FS, base, snap SnapshotID, dir string) (*PromoteResult, error) {
	return f.Promote(ctx, base, snap, dir, PromoteOptions{})
}

// promoteTrees returns the base tree and the changed tree the promote
// scenario promotes between: files in four directories, a directory that
// goes, a symlink that changes; a third of the files change, a fifth go,
// and new files come in a new directory and beside old ones.
func promoteTrees() (base, next map[string]string) {
	base, next = map[string]string{}, map[string]string{}
	for i := 0; i < 150; i++ {
		p := fmt.Sprintf("d%d/f%d", i%4, i)
		content := string(pattern(uint64(i), 1000+i*211%30000))
		base[p] = content
		switch {
		case i%3 == 0:
			next[p] = string(pattern(uint64(i)+1000, 500+i*157%40000))
		case i%5 == 1:
		default:
			next[p] = content
		}
	}
	for j := 0; j < 5; j++ {
		base[fmt.Sprintf("gone/x%d", j)] = "gone"
	}
	for j := 0; j < 10; j++ {
		next[fmt.Sprintf("new/a%d", j)] = string(pattern(uint64(j)+2000, 3000+j*1000))
		next[fmt.Sprintf("d1/n%d", j)] = string(pattern(uint64(j)+3000, 2000+j*700))
	}
	base["link"] = "->d0/f0"
	next["link"] = "->d1/f1"
	return base, next
}

// crashPromoteChild imports both trees, writes the base tree to the host
// directory and promotes the changes into it.
func crashPromoteChild(c *crashChildRun) error {
	base, next := promoteTrees()
	var ids [2]SnapshotID
	for i, tree := range []map[string]string{base, next} {
		src, err := os.MkdirTemp(c.work, "src")
		if err != nil {
			return err
		}
		if err := writeFiles(src, tree); err != nil {
			return err
		}
		if ids[i], err = c.f.Import(c.ctx, src, ""); err != nil {
			return err
		}
	}
	host := filepath.Join(c.work, "host")
	if err := os.Mkdir(host, 0o755); err != nil {
		return err
	}
	if err := writeFiles(host, base); err != nil {
		return err
	}
	c.say("PROMOTE %s %s", ids[0], ids[1])
	c.say("READY")
	if _, err := promoteInto(c.ctx, c.f, ids[0], ids[1], host); err != nil {
		return err
	}
	return nil
}

// writeFiles writes a tree as writeTree does, returning errors.
func writeFiles(dir string, files map[string]string) error {
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		var err error
		if len(content) > 2 && content[:2] == "->" {
			err = os.Symlink(content[2:], full)
		} else {
			err = os.WriteFile(full, []byte(content), 0o644)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkPromote checks the host directory after a kill during Promote:
// every path holds its old or its new entry and nothing else is there;
// then promotes again, which must either finish with the host holding the
// new tree, or report as conflicts exactly the paths already changed.
func checkPromote(t *testing.T, k *crashKill) {
	ctx := context.Background()
	fail := func(format string, a ...any) {
		t.Helper()
		t.Errorf("promote seed %d: %s", k.seed, fmt.Sprintf(format, a...))
	}
	pl := k.log.extra["PROMOTE"]
	if len(pl) != 1 {
		fail("child did not say what it promotes: %q", pl)
		return
	}
	var baseHex, nextHex string
	fmt.Sscanf(pl[0], "PROMOTE %s %s", &baseHex, &nextHex)
	base, err1 := k.f.Resolve(ctx, baseHex)
	next, err2 := k.f.Resolve(ctx, nextHex)
	if err := errors.Join(err1, err2); err != nil {
		fail("%v", err)
		return
	}
	old, err1 := readSnapTree(k.f, base)
	want, err2 := readSnapTree(k.f, next)
	host := filepath.Join(k.work, "host")
	got, err3 := readHostTree(host)
	if err := errors.Join(err1, err2, err3); err != nil {
		fail("%v", err)
		return
	}
	var torn []string
	for p, n := range got {
		if o, ok := old[p]; ok && o == n {
			continue
		}
		if w, ok := want[p]; ok && w == n {
			continue
		}
		if w, ok := want[promoteTarget(p)]; ok && w == n {
			// Killed between naming a complete new entry and renaming
			// it over its path: whole, not torn; the user removes it.
			delete(got, p)
			t.Logf("promote seed %d: complete new entry left at %s", k.seed, p)
			continue
		}
		torn = append(torn, p)
	}
	for p := range old {
		if _, ok := got[p]; !ok {
			if _, inNew := want[p]; inNew {
				torn = append(torn, p+" (missing)")
			}
		}
	}
	sort.Strings(torn)
	if len(torn) > 0 {
		fail("after the kill the host holds neither the old nor the new entry at %q", torn)
	}

	res, err := promoteInto(ctx, k.f, base, next, host)
	if err == nil {
		again, err := readHostTree(host)
		if err != nil {
			fail("%v", err)
			return
		}
		for p := range again {
			if _, ok := got[p]; !ok && promoteTarget(p) != "" {
				delete(again, p) // the leftover logged above
			}
		}
		for p, n := range want {
			if again[p] != n {
				fail("promoted again: %s is not the new entry", p)
			}
		}
		for p := range again {
			if _, ok := want[p]; !ok {
				fail("promoted again: %s is on the host but not in the new tree", p)
			}
		}
		return
	}
	if !errors.Is(err, ErrConflict) || res == nil {
		fail("promote again: %v", err)
		return
	}
	// Every path the first promotion changed, the contents of new
	// directories included.
	var wantConf []string
	for _, c := range res.Changes {
		if c.Path == "" {
			continue
		}
		o, inOld := old[c.Path]
		h, onHost := got[c.Path]
		if inOld != onHost || o.typ != h.typ || o.typ == TypeFile && o.data != h.data || o.target != h.target {
			wantConf = append(wantConf, c.Path)
		}
	}
	var gotConf []string
	for _, c := range res.Conflicts {
		gotConf = append(gotConf, c.Path)
	}
	sort.Strings(wantConf)
	sort.Strings(gotConf)
	if fmt.Sprint(gotConf) != fmt.Sprint(wantConf) {
		fail("promote again reports conflicts at %q, the paths already changed are %q", gotConf, wantConf)
	}
}

// promoteTarget returns the path a temporary entry of Promote at p stands
// for, or "".
func promoteTarget(p string) string {
	dir, name := path.Split(p)
	i := strings.LastIndex(name, ".tine-promote-")
	if !strings.HasPrefix(name, ".") || i < 1 {
		return ""
	}
	return dir + name[1:i]
}
