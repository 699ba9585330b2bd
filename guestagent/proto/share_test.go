package proto

import (
	"path"
	"strings"
	"testing"
)

func TestShareMountCheck(t *testing.T) {
	for _, s := range []ShareMount{{"tine-project", "/home/me/proj"}, {strings.Repeat("t", 36), "/x"}} {
		if err := s.Check(); err != nil {
			t.Errorf("%+v refused: %v", s, err)
		}
	}
	for _, s := range []ShareMount{{"", "/x"}, {strings.Repeat("t", 37), "/x"}, {"t", "x"}, {"t", "/"}, {"t", "/a/../b"},
		{"t", "/proc/x"}, {"t", "/dev"}, {"t", "/run/tine"}, {"t\x00", "/x"}, {"t", "/a/"}} {
		if err := s.Check(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}

// FuzzShareMount: a hygiene request's share that passes Check has a
// bounded tag and a clean absolute path other than / outside the
// kernel's file systems.
func FuzzShareMount(f *testing.F) {
	f.Add([]byte(`{"generation":3,"share":{"tag":"tine-project","path":"/home/me/proj"}}`))
	f.Add([]byte(`{"share":{"tag":"","path":"/../proc"}}`))
	f.Add([]byte(`{"share":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h HygieneRequest
		if Decode(Frame{Kind: KindHygiene, Payload: b}, &h) != nil || h.Check() != nil || h.Share == nil {
			return
		}
		s := h.Share
		if len(s.Tag) == 0 || len(s.Tag) > MaxShareTag || path.Clean(s.Path) != s.Path || !path.IsAbs(s.Path) || s.Path == "/" || strings.HasPrefix(s.Path, "/proc") && (s.Path == "/proc" || s.Path[5] == '/') {
			t.Fatalf("Check passed %+v", s)
		}
	})
}
