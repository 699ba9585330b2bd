package ns

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/internal/atomicfile"
	"tine/internal/fuzzbytes"
)

// FuzzCopyLayerIndexed: a layer a sandbox could write (files,
// directories, symlinks, whiteouts, opaque directories), copied, changed
// in ways r chooses (bytes rewritten with the times set back, modes,
// owners, xattrs, truncates, sparse growth, removals, renames, hard
// links, new files)
// and copied again from the first copy's index, twice: every copy is its
// source, whatever the earlier copies let it link.
func FuzzCopyLayerIndexed(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("needs root: whiteouts, owners and trusted.* attributes")
	}
	f.Add([]byte{6, 0, 0, 0, 1, 1, 3, 0, 2, 9, 2, 0, 1, 0, 3, 4, 1, 2, 3, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{7, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 9, 9, 9, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4})
	// Every file counts as settled once written out: the copy's clock is
	// set ahead of the racy window (a sleep per input stalls the fuzzing
	// workers). Safe where changes get distinct ctimes, as ext4's and
	// tmpfs's multigrain timestamps (Linux 6.13+) give them.
	clock := copyClock
	copyClock = func() time.Time { return time.Now().Add(time.Second) }
	f.Cleanup(func() { copyClock = clock })
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 256 {
			return
		}
		r := fuzzbytes.New(b)
		ctx := context.Background()
		base := t.TempDir()
		src := filepath.Join(base, "src")
		if err := os.Mkdir(src, 0o755); err != nil {
			t.Fatal(err)
		}
		for ops := 1 + int(r.Byte()%8); ops > 0 && r.Len() > 0; ops-- {
			fuzzEntry(t, src, r, true)
		}
		var ref *layerIndex
		for round := range 3 {
			if round > 0 {
				for ops := 1 + int(r.Byte()%6); ops > 0 && r.Len() > 0; ops-- {
					fuzzChange(t, src, r)
				}
			}
			// Pages written out, so that the copy records the files.
			if err := atomicfile.SyncFS(src); err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(base, "copy"+string(rune('0'+round)))
			x, err := copyLayerIndexed(ctx, src, dst, ref)
			if err != nil {
				t.Fatal(err)
			}
			sameContent(t, src, dst)
			ref = x
		}
	})
}

// fuzzChange changes one entry of the layer dir that r chooses, or adds
// one.
func fuzzChange(t *testing.T, dir string, r *fuzzbytes.Reader) {
	var files []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	op := r.Byte() % 9
	if len(files) == 0 || op == 8 {
		fuzzEntry(t, dir, r, true)
		return
	}
	p := files[int(r.Byte())%len(files)]
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	var err error
	switch op {
	case 0: // the same size, other bytes, the times set back
		var data []byte
		if data, err = os.ReadFile(p); err == nil && len(data) > 0 {
			data[0] ^= 0xff
			if err = os.WriteFile(p, data, 0); err == nil {
				err = unix.UtimesNano(p, []unix.Timespec{st.Atim, st.Mtim})
			}
		}
	case 1:
		err = os.Chmod(p, os.FileMode(st.Mode&0o777^0o111))
	case 2:
		err = os.Lchown(p, int(st.Uid)+1, int(st.Gid))
	case 3:
		err = unix.Lsetxattr(p, "user.fuzz", []byte{r.Byte()}, 0)
	case 4: // cut, or grown past its end with a byte in the hole (sparse)
		size := int64(r.Byte()%4) << (r.Byte() % 18)
		if err = os.Truncate(p, size); err == nil && size > 8192 {
			var f *os.File
			if f, err = os.OpenFile(p, os.O_WRONLY, 0); err == nil {
				_, err = f.WriteAt([]byte{r.Byte()}, size/2)
				f.Close()
			}
		}
	case 5:
		err = os.Remove(p)
	case 6: // another file renamed over it
		q := files[int(r.Byte())%len(files)]
		if q != p {
			err = os.Rename(q, p)
		}
	case 7:
		err = os.Link(p, p+"-link")
		if os.IsExist(err) {
			err = nil
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}
