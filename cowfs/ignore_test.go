package cowfs

import (
	"testing"
)

func TestIgnoreRules(t *testing.T) {
	cases := []struct {
		gitignore string
		path      string
		isDir     bool
		want      bool
	}{
		{"*.o", "a.o", false, true},
		{"*.o", "src/deep/a.o", false, true},
		{"*.o", "a.oo", false, false},
		{"*.o\n!keep.o", "keep.o", false, false},
		{"!keep.o\n*.o", "keep.o", false, true}, // the last match wins
		{"build/", "build", true, true},
		{"build/", "build", false, false},
		{"build/", "src/build", true, true},
		{"/build", "build", false, true},
		{"/build", "src/build", false, false},
		{"doc/*.txt", "doc/a.txt", false, true},
		{"doc/*.txt", "doc/sub/a.txt", false, false},
		{"doc/*.txt", "x/doc/a.txt", false, false}, // a middle slash anchors
		{"**/foo", "foo", false, true},
		{"**/foo", "a/b/foo", false, true},
		{"**/foo/bar", "a/foo/bar", false, true},
		{"a/**/b", "a/b", false, true},
		{"a/**/b", "a/x/y/b", false, true},
		{"a/**/b", "a/xb", false, false},
		{"a/**", "a/x/y", false, true},
		{"a/**", "a", true, false},
		{"a**b", "axxb", false, true}, // not a whole component: a plain star
		{"a**b", "ax/xb", false, false},
		{"?.c", "x.c", false, true},
		{"?.c", "xy.c", false, false},
		{"[abc].c", "b.c", false, true},
		{"[!abc].c", "b.c", false, false},
		{"[^abc].c", "d.c", false, true},
		{"[a-c]x", "bx", false, true},
		{"[a-c]x", "dx", false, false},
		{"[]]x", "]x", false, true},
		{"[[:digit:]]x", "7x", false, true},
		{"[[:digit:]]x", "ax", false, false},
		{"[abc", "[abc", false, false}, // malformed: matches nothing
		{"\\#hash", "#hash", false, true},
		{"#comment", "#comment", false, false},
		{"\\!bang", "!bang", false, true},
		{"trail  ", "trail", false, true},
		{"trail\\ ", "trail ", false, true},
		{"trail\\ ", "trail", false, false},
		{"crlf\r\n", "crlf", false, true},
		{"\xef\xbb\xbfbom", "bom", false, true},
		{"*", "anything/at/all", false, true},
		{"", "x", false, false},
		{"!", "x", false, false},
		{"/", "x", true, false},
		{"a\\*b", "a*b", false, true},
		{"a\\*b", "axb", false, false},
	}
	var buf []bool
	for _, c := range cases {
		d := &ignoreDir{rules: parseIgnore([]byte(c.gitignore))}
		if got := d.ignored(c.path, c.isDir, &buf); got != c.want {
			t.Errorf("%q: ignored(%q, dir=%v) = %v, want %v", c.gitignore, c.path, c.isDir, got, c.want)
		}
	}
	// A deeper file's rules apply below its directory, relative to it,
	// and win over the rules above.
	top := &ignoreDir{rules: parseIgnore([]byte("*.log\n/top-only\n"))}
	sub := &ignoreDir{parent: top, base: "sub", rules: parseIgnore([]byte("!keep.log\n/anch\n"))}
	for p, want := range map[string]bool{"sub/x.log": true, "sub/keep.log": false, "sub/anch": true, "sub/deeper/anch": false, "sub/top-only": false} {
		if got := sub.ignored(p, false, &buf); got != want {
			t.Errorf("nested: ignored(%q) = %v, want %v", p, got, want)
		}
	}
}

// FuzzIgnore parses any .gitignore and matches any path: no panic, and a
// literal pattern always matches its own text.
func FuzzIgnore(f *testing.F) {
	f.Add("*.o\n!keep.o\nbuild/\n/a/**/b\n[a-z]?\\#", "a/x/b")
	f.Add("[[:alpha:]", "x")
	f.Add("**/**/**", "a/b/c")
	f.Fuzz(func(t *testing.T, text, p string) {
		var buf []bool
		d := &ignoreDir{rules: parseIgnore([]byte(text))}
		d.ignored(p, false, &buf)
		d.ignored(p, true, &buf)
		for i := 0; i < len(p); i++ {
			if c := p[i]; c == '*' || c == '?' || c == '[' || c == '\\' || c == '/' || c == '\n' || c == '\r' || c == ' ' || c == '!' || c == '#' {
				return
			}
		}
		if p != "" && !(&ignoreDir{rules: parseIgnore([]byte(p))}).ignored(p, false, &buf) {
			t.Errorf("literal pattern %q does not match itself", p)
		}
	})
}
