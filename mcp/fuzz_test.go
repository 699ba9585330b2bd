package mcp

import (
	"strings"
	"testing"
)

// FuzzParseURI: resource URIs come from the client; parsing never panics,
// and what it accepts names a sandbox and, for files, an absolute path.
func FuzzParseURI(f *testing.F) {
	for _, s := range []string{"tine://sandboxes/a/files/etc/passwd", "tine://sandboxes/a/diff", "tine://sandboxes/a/audit", "tine://sandboxes//diff",
		"tine://sandboxes/a%2Fb/files/x", "tine://sandboxes/a/files/%zz", "tine://other/a/diff", "tine://sandboxes/a/filesx"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		sb, kind, path, err := parseURI(uri)
		if err != nil {
			return
		}
		if sb == "" {
			t.Fatalf("%q: empty sandbox accepted", uri)
		}
		switch kind {
		case "diff", "audit":
		case "files":
			if !strings.HasPrefix(path, "/") {
				t.Fatalf("%q: relative path %q accepted", uri, path)
			}
		default:
			t.Fatalf("%q: kind %q", uri, kind)
		}
	})
}
