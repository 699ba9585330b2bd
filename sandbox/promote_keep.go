package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"tine/cowfs"
)

var (
	hexID     = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`) })
	looseDir  = regexp.MustCompile(`^[0-9a-f]{2}$`)
	looseName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9a-f]{38}|[0-9a-f]{62})$`) })
	packName  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^pack-[0-9a-f]{40,64}\.(pack|idx)$`) })
	refName   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^refs/[A-Za-z0-9._/-]{1,240}$`) })
)

// keepCommits brings the commits the sandbox made in its copy of the
// repository (from base to its HEAD) into the host repository g and
// returns that HEAD (base when it made none). The sandbox's .git is
// hostile: only its HEAD, the ref HEAD names and the object files
// (loose objects and packs, bounded in count and bytes) are read out of
// the snapshot, never its config, hooks or alternates; they are put in a
// new private repository that borrows the host's objects, and the new
// objects cross into the host as a pack that git index-pack --strict
// checks object by object.
func (m *Manager) keepCommits(ctx context.Context, g *gitRepo, theirs cowfs.SnapshotID, base, tmp string, res *GitPromoteResult) (string, error) {
	head, err := m.sandboxHead(ctx, theirs)
	if err != nil {
		return "", err
	}
	if head == base {
		return base, nil
	}
	format, err := g.line(ctx, nil, "rev-parse", "--show-object-format")
	if err != nil {
		return "", err
	}
	common, err := g.line(ctx, nil, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return "", err
	}
	repo := filepath.Join(tmp, "sandbox.git")
	if _, err := (&gitRepo{dir: tmp}).out(ctx, nil, "init", "-q", "--bare", "--template=", "--object-format="+format, repo); err != nil {
		return "", err
	}
	if err := m.copyObjects(ctx, theirs, filepath.Join(repo, "objects")); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(repo, "objects", "info"), 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(repo, "objects", "info", "alternates"), []byte(filepath.Join(common, "objects")+"\n"), 0o600); err != nil {
		return "", err
	}
	t := &gitRepo{dir: repo}
	if _, err := t.rev(ctx, head); err != nil {
		return "", fmt.Errorf("the sandbox's HEAD %s is not a commit its .git holds", head)
	}
	if _, err := t.out(ctx, nil, "merge-base", "--is-ancestor", base, head); err != nil {
		return "", fmt.Errorf("the sandbox's HEAD %s does not descend from %s, the commit it was made from (its history was rewritten); promote without --keep-commits", head, base)
	}
	list, err := t.out(ctx, nil, "rev-list", "--reverse", "--max-count", fmt.Sprint(maxKeepCommits+1), base+".."+head)
	if err != nil {
		return "", err
	}
	res.Kept = strings.Fields(string(list))
	if len(res.Kept) > maxKeepCommits {
		return "", fmt.Errorf("the sandbox made more than %d commits", maxKeepCommits)
	}
	// pack-objects in the private repository | index-pack --strict in
	// the host's.
	pr, pw := io.Pipe()
	pack := t.cmd(ctx, "pack-objects", "--revs", "--stdout", "-q")
	pack.Stdin = strings.NewReader(head + "\n^" + base + "\n")
	pack.Stdout = pw
	var perr strings.Builder
	pack.Stderr = &limitWriter{w: &perr, n: 4 << 10}
	if err := pack.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { err := pack.Wait(); pw.CloseWithError(err); done <- err }()
	_, ierr := g.out(ctx, pr, "index-pack", "--stdin", "--strict")
	pr.CloseWithError(io.ErrClosedPipe)
	if werr := <-done; werr != nil && ierr == nil {
		ierr = fmt.Errorf("git pack-objects: %v: %s", werr, strings.TrimSpace(perr.String()))
	}
	if ierr != nil {
		return "", fmt.Errorf("copy the sandbox's commits: %w", ierr)
	}
	if _, err := g.rev(ctx, head); err != nil {
		return "", fmt.Errorf("the sandbox's HEAD %s did not arrive: %w", head, err)
	}
	return head, nil
}

// sandboxHead reads the commit id HEAD names in the sandbox's .git.
func (m *Manager) sandboxHead(ctx context.Context, snap cowfs.SnapshotID) (string, error) {
	gd, err := m.lookup(ctx, snap, ".git")
	if err != nil {
		return "", err
	}
	if gd == nil || gd.Type != cowfs.TypeDir {
		return "", fmt.Errorf("the sandbox's project has no .git directory")
	}
	return headOf(func(p string, max int64) (string, bool, error) {
		e, err := m.lookup(ctx, snap, p)
		if err != nil || e == nil || e.Type != cowfs.TypeFile {
			return "", false, err
		}
		b, err := m.fs.ReadFileData(ctx, e, max)
		return string(b), err == nil, err
	})
}

// headOf resolves HEAD in a .git whose files (written by the sandbox)
// read gives: at most max bytes of a path below the project, ok false
// when it is not a file. It reads only .git/HEAD, .git/refs/... and
// .git/packed-refs, and returns a commit id or an error.
func headOf(read func(p string, max int64) (string, bool, error)) (string, error) {
	h, ok, err := read(".git/HEAD", maxRefBytes)
	if err != nil || !ok {
		return "", fmt.Errorf("the sandbox's .git/HEAD: missing or unreadable (%v)", err)
	}
	h = strings.TrimSpace(h)
	ref, isRef := strings.CutPrefix(h, "ref: ")
	if !isRef {
		if !hexID().MatchString(h) {
			return "", fmt.Errorf("the sandbox's .git/HEAD is neither a ref nor a commit id")
		}
		return h, nil
	}
	if !refName().MatchString(ref) || strings.Contains(ref, "..") || strings.Contains(ref, "//") {
		return "", fmt.Errorf("the sandbox's HEAD names a bad ref %q", ref)
	}
	if v, ok, err := read(".git/"+ref, maxRefBytes); err != nil {
		return "", err
	} else if ok {
		v = strings.TrimSpace(v)
		if !hexID().MatchString(v) {
			return "", fmt.Errorf("the sandbox's ref %s holds no commit id", ref)
		}
		return v, nil
	}
	packed, ok, err := read(".git/packed-refs", maxPackedRefs)
	if err != nil {
		return "", err
	}
	if ok {
		for _, l := range strings.Split(packed, "\n") {
			if id, name, ok := strings.Cut(strings.TrimSpace(l), " "); ok && name == ref && hexID().MatchString(id) {
				return id, nil
			}
		}
	}
	return "", fmt.Errorf("the sandbox's HEAD names %s, which has no commit (no commits made?)", ref)
}

// copyObjects copies the object files of the sandbox's .git/objects (loose
// objects and pack files, nothing else: no info/alternates) into dir,
// refusing more than maxKeepFiles files or maxKeepBytes bytes.
func (m *Manager) copyObjects(ctx context.Context, snap cowfs.SnapshotID, dir string) error {
	od, err := m.lookup(ctx, snap, ".git/objects")
	if err != nil {
		return err
	}
	if od == nil || od.Type != cowfs.TypeDir {
		return fmt.Errorf("the sandbox's .git has no objects directory")
	}
	ents, err := m.fs.ReadDirEntry(ctx, od)
	if err != nil {
		return err
	}
	files, bytes := 0, int64(0)
	put := func(sub string, e *cowfs.Entry) error {
		files++
		bytes += e.Size
		if files > maxKeepFiles || bytes > maxKeepBytes {
			return fmt.Errorf("the sandbox's .git/objects holds more than %d files or %d bytes", maxKeepFiles, maxKeepBytes)
		}
		r, err := m.fs.OpenFileData(ctx, e)
		if err != nil {
			return err
		}
		d := filepath.Join(dir, sub)
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(filepath.Join(d, e.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, io.LimitReader(r, e.Size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	for i := range ents {
		d := &ents[i]
		if d.Type != cowfs.TypeDir || !(looseDir.MatchString(d.Name) || d.Name == "pack") {
			continue
		}
		kids, err := m.fs.ReadDirEntry(ctx, d)
		if err != nil {
			return err
		}
		for j := range kids {
			k := &kids[j]
			ok := k.Type == cowfs.TypeFile && (d.Name == "pack" && packName().MatchString(k.Name) || d.Name != "pack" && looseName().MatchString(k.Name))
			if !ok {
				continue
			}
			if err := put(d.Name, k); err != nil {
				return err
			}
		}
	}
	return nil
}

// limitWriter keeps the first n bytes written to it.
type limitWriter struct {
	w *strings.Builder
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if room := l.n - l.w.Len(); room > 0 {
		l.w.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
