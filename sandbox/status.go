package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"tine/cowfs"
)

// Status returns a sandbox's metadata with what is live about it: its
// processes (the agent among them) and listening sockets, as its agent
// sees them, the bytes charged to its project branch, and how far the
// host directory it came from has moved on since (Staleness).
func (m *Manager) Status(ctx context.Context, name string) (*Status, error) {
	info, err := m.Get(name)
	if err != nil {
		return nil, err
	}
	st := &Status{Info: *info}
	// A frozen sandbox's agent does not answer: its counts stay 0.
	if _, err := m.running(name); err == nil && m.Frozen(name) == "" {
		c, err := m.Agent(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("status of sandbox %q: %w", name, err)
		}
		ps, err := c.Ps(ctx)
		if err != nil {
			return nil, fmt.Errorf("status of sandbox %q: list processes: %w", name, err)
		}
		ports, err := c.Ports(ctx)
		if err != nil {
			return nil, fmt.Errorf("status of sandbox %q: list ports: %w", name, err)
		}
		st.Processes, st.Ports = len(ps), len(ports)
	}
	if st.ProjectBytes, _, err = m.fs.BranchUsage(ctx, info.Branch); err != nil {
		return nil, fmt.Errorf("status of sandbox %q: %w", name, err)
	}
	st.Stale = m.staleness(ctx, info)
	st.Stale.Git = gitStale(ctx, info)
	return st, nil
}

// Bounds of the staleness walk: the host directory is not the sandbox's,
// but it may be huge.
const (
	staleMaxEntries = 200_000
	staleMaxTime    = 5 * time.Second
	staleExamples   = 10
)

// staleness compares the host directory's metadata with the snapshot it
// was imported as (HostBase). A file counts as changed when its type,
// size, mode, owner or modification time differs; an added or removed
// directory counts once, without its contents; a directory's own
// modification time is not compared (adding a file changes it). No file
// is read.
func (m *Manager) staleness(ctx context.Context, info *Info) Staleness {
	if info.HostBase == "" {
		return Staleness{Unknown: fmt.Sprintf("made from snapshot %s, which does not record its host directory", info.From)}
	}
	base, err := m.fs.Resolve(ctx, info.HostBase)
	if err != nil {
		return Staleness{Unknown: fmt.Sprintf("the host base %s: %v", info.HostBase, err)}
	}
	ctx, cancel := context.WithTimeout(ctx, staleMaxTime)
	defer cancel()
	s, err := compareHost(ctx, m.fs, base, info.ProjectPath, staleMaxEntries)
	if err != nil {
		return Staleness{Unknown: err.Error()}
	}
	return s
}

// compareHost walks host directory dir and snapshot snap side by side,
// keeping its own stack, and stops after max entries or when ctx ends
// (the result is then Partial).
func compareHost(ctx context.Context, fs *cowfs.FS, snap cowfs.SnapshotID, dir string, max int) (Staleness, error) {
	var s Staleness
	top, err := fs.TopEntry(ctx, snap)
	if err != nil {
		return s, err
	}
	var hst unix.Stat_t
	if err := unix.Lstat(dir, &hst); err != nil {
		return s, fmt.Errorf("the host directory %s: %w", dir, err)
	}
	if hst.Mode&unix.S_IFMT != unix.S_IFDIR {
		return s, fmt.Errorf("the host directory %s is no longer a directory", dir)
	}
	note := func(n *int, p string) {
		*n++
		if len(s.Examples) < staleExamples {
			s.Examples = append(s.Examples, p)
		}
	}
	type item struct {
		rel string
		e   cowfs.Entry
	}
	stack := []item{{"", top}}
	seen := 0
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if ctx.Err() != nil || seen >= max {
			s.Partial = true
			break
		}
		entries, err := fs.ReadDirEntry(ctx, &it.e)
		if err != nil {
			if ctx.Err() != nil {
				s.Partial = true
				break
			}
			return s, err
		}
		names, err := readNames(filepath.Join(dir, it.rel))
		if errors.Is(err, unix.ENAMETOOLONG) {
			s.Partial = true
			continue
		}
		if err != nil {
			// Replaced or gone since the parent was looked at.
			note(&s.Changed, it.rel+"/")
			continue
		}
		// Each name once, whichever side holds it.
		if len(names) > len(entries) {
			seen += len(names)
		} else {
			seen += len(entries)
		}
		i, j := 0, 0
		for i < len(entries) || j < len(names) {
			switch {
			case j == len(names) || i < len(entries) && entries[i].Name < names[j]:
				p := path.Join(it.rel, entries[i].Name)
				if entries[i].Type == cowfs.TypeDir {
					p += "/"
				}
				note(&s.Removed, p)
				i++
			case i == len(entries) || names[j] < entries[i].Name:
				p := path.Join(it.rel, names[j])
				note(&s.Added, p)
				j++
			default:
				e := entries[i]
				p := path.Join(it.rel, e.Name)
				i, j = i+1, j+1
				var st unix.Stat_t
				if err := unix.Lstat(filepath.Join(dir, p), &st); errors.Is(err, unix.ENAMETOOLONG) {
					// Deeper than a path can name: not compared (Partial).
					s.Partial = true
					continue
				} else if err != nil {
					note(&s.Removed, p)
					continue
				}
				if differs(&e, &st) {
					note(&s.Changed, p)
				} else if e.Type == cowfs.TypeDir {
					stack = append(stack, item{p, e})
				}
			}
		}
	}
	return s, nil
}

// readNames lists a host directory's names, sorted, without following a
// symlink at its last component.
func readNames(dir string) ([]string, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

// differs reports whether a host entry's metadata differs from what the
// import recorded.
func differs(e *cowfs.Entry, st *unix.Stat_t) bool {
	typ, ok := entryType(st.Mode)
	if !ok || typ != e.Type {
		return true
	}
	if st.Mode&0o7777 != e.Mode&0o7777 || st.Uid != e.UID || st.Gid != e.GID {
		return true
	}
	if e.Type == cowfs.TypeDir {
		return false
	}
	if e.Type == cowfs.TypeFile || e.Type == cowfs.TypeSymlink {
		if st.Size != e.Size {
			return true
		}
	}
	return st.Mtim.Nano() != e.MtimeNs
}

// entryType maps a stat mode to a cowfs entry type.
func entryType(mode uint32) (cowfs.EntryType, bool) {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return cowfs.TypeFile, true
	case unix.S_IFDIR:
		return cowfs.TypeDir, true
	case unix.S_IFLNK:
		return cowfs.TypeSymlink, true
	case unix.S_IFIFO:
		return cowfs.TypeFifo, true
	case unix.S_IFSOCK:
		return cowfs.TypeSocket, true
	case unix.S_IFCHR:
		return cowfs.TypeChar, true
	case unix.S_IFBLK:
		return cowfs.TypeBlock, true
	}
	return 0, false
}
