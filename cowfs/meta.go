package cowfs

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"tine/chunkstore"
)

// branchMeta holds a branch's settings and its quota count. It is a small
// store object named by the ref refMeta+branch, which a commit moves in the
// same ref log record as the branch head (ADR 0189): one fdatasync makes
// both durable, and after a crash the count matches the head kept.
type branchMeta struct {
	QuotaBytes int64 `json:"quota_bytes,omitempty"` // 0: unlimited
	UsedBytes  int64 `json:"used_bytes"`            // bytes charged so far (docs/limits.md)
}

// maxMetaObject bounds the object readMeta decodes: an encoded branchMeta
// is under 100 bytes.
const maxMetaObject = 4 << 10

// readMeta returns the branch's settings: the object its meta ref names,
// or, for a branch last written before that ref existed, its meta.json
// file. Neither means no quota and nothing charged.
func (f *FS) readMeta(name string) (branchMeta, error) {
	var m branchMeta
	id, ok, err := f.getRef(refMeta + name)
	if err != nil {
		return m, err
	}
	if ok {
		b, err := f.store.Get(id)
		if err == nil {
			err = decodeMeta(b, &m)
		}
		if err != nil {
			return m, fmt.Errorf("branch %q: read meta object %s: %w", name, id, err)
		}
		return m, nil
	}
	p := filepath.Join(f.branchDir(name), "meta.json")
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, fmt.Errorf("read branch meta %s: %w", p, err)
	}
	if err := decodeMeta(b, &m); err != nil {
		return m, fmt.Errorf("decode branch meta %s: %w", p, err)
	}
	return m, nil
}

func decodeMeta(b []byte, m *branchMeta) error {
	if len(b) > maxMetaObject {
		return fmt.Errorf("%w: meta of %d bytes, want at most %d", errCorrupt, len(b), maxMetaObject)
	}
	if err := json.Unmarshal(b, m); err != nil {
		return fmt.Errorf("%w: %v", errCorrupt, err)
	}
	if m.QuotaBytes < 0 || m.UsedBytes < 0 {
		return fmt.Errorf("%w: negative quota %d or count %d", errCorrupt, m.QuotaBytes, m.UsedBytes)
	}
	return nil
}

// metaUpdate stores m and returns the ref update that makes it the
// branch's settings. The object is journaled in the ref log record that
// applies the update.
func (f *FS) metaUpdate(name string, m branchMeta) (chunkstore.RefUpdate, error) {
	cur, _, err := f.getRef(refMeta + name)
	if err != nil {
		return chunkstore.RefUpdate{}, err
	}
	b, _ := json.Marshal(m)
	id, err := f.store.Put(b)
	if err != nil {
		return chunkstore.RefUpdate{}, fmt.Errorf("branch %q: store meta: %w", name, err)
	}
	return chunkstore.RefUpdate{Name: refMeta + name, Old: cur, New: id}, nil
}

// writeMeta durably replaces the branch's settings on their own (a quota
// set); a commit moves them with the head instead (branch.commitRefs).
func (f *FS) writeMeta(name string, m branchMeta) error {
	for try := 0; ; try++ {
		up, err := f.metaUpdate(name, m)
		if err != nil {
			return err
		}
		err = f.store.UpdateRefs(up)
		if err == nil {
			return nil
		}
		if !errors.Is(err, chunkstore.ErrConflict) || try > 5 {
			return fmt.Errorf("branch %q: write meta: %w", name, err)
		}
	}
}
