package sandbox

import (
	"strings"
	"testing"
)

// FuzzHeadOf: whatever a sandbox writes in .git/HEAD, a ref and
// packed-refs, resolving its HEAD on the host reads only those files,
// within their bounds, and returns a commit id or an error.
func FuzzHeadOf(f *testing.F) {
	id := strings.Repeat("ab", 20)
	f.Add("ref: refs/heads/main\n", "refs/heads/main", id+"\n", "")
	f.Add(id, "", "", "")
	f.Add("ref: refs/heads/x\n", "", "", "# pack-refs\n"+id+" refs/heads/x\n")
	f.Add("ref: refs/../../etc/passwd", "refs/../../etc/passwd", id, "")
	f.Add("ref: refs/heads//x", "refs/heads//x", id, "")
	f.Add("ref: "+strings.Repeat("refs/", 100), "", "", "")
	f.Fuzz(func(t *testing.T, head, refPath, ref, packed string) {
		files := map[string]string{".git/HEAD": head, ".git/packed-refs": packed}
		if refPath != "" {
			files[".git/"+refPath] = ref
		}
		got, err := headOf(func(p string, max int64) (string, bool, error) {
			if p != ".git/HEAD" && p != ".git/packed-refs" &&
				(!strings.HasPrefix(p, ".git/refs/") || strings.Contains(p, "..") || strings.Contains(p, "//")) {
				t.Fatalf("read %q: outside .git's HEAD, refs and packed-refs", p)
			}
			v, ok := files[p]
			if int64(len(v)) > max {
				v = v[:max]
			}
			return v, ok, nil
		})
		if err == nil && !hexID().MatchString(got) {
			t.Fatalf("HEAD resolved to %q, not a commit id", got)
		}
	})
}
