package proto

import (
	"fmt"
	"path"
	"strings"
)

// MaxShareTag is the longest virtio-fs tag (the device's tag field).
const MaxShareTag = 36

// ShareMount names a virtio-fs device by its tag and the guest path to
// mount it at: the vm runtime's project share, mounted at the project's
// own path.
type ShareMount struct {
	Tag  string `json:"tag"`
	Path string `json:"path"`
}

// Check refuses a share the agent must not mount: an empty or too long
// tag, a path that is not absolute and clean, the root, or a path under
// the guest's kernel file systems. A nil share is fine.
func (s *ShareMount) Check() error {
	if s == nil {
		return nil
	}
	if s.Tag == "" || len(s.Tag) > MaxShareTag || strings.ContainsRune(s.Tag, 0) {
		return fmt.Errorf("share tag %q: want 1 to %d bytes without NUL", s.Tag, MaxShareTag)
	}
	if len(s.Path) > 4096 || !path.IsAbs(s.Path) || path.Clean(s.Path) != s.Path || s.Path == "/" || strings.ContainsRune(s.Path, 0) {
		return fmt.Errorf("share path %q: want a clean absolute path other than /", s.Path)
	}
	for _, p := range []string{"/proc", "/sys", "/dev", "/run"} {
		if s.Path == p || strings.HasPrefix(s.Path, p+"/") {
			return fmt.Errorf("share path %q is under the guest's %s", s.Path, p)
		}
	}
	return nil
}
