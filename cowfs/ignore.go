package cowfs

import (
	"bytes"
	"strings"
)

// ignoreRule is one pattern line of a .gitignore file.
type ignoreRule struct {
	toks     []globTok
	negate   bool // "!pattern": re-include
	dirOnly  bool // "pattern/": directories only
	anchored bool // holds a slash: matched against the path below the file's directory, not the base name
}

// globTok is one step of a compiled pattern.
type globTok struct {
	kind  byte // tokLit, tokOne, tokClass, tokStar, tokAnyDirs, tokAll, tokNever
	c     byte
	neg   bool      // tokClass: negated ("[!...]")
	class [4]uint64 // tokClass: the bytes it holds
}

const (
	tokLit     = iota // the byte c
	tokOne            // "?": one byte other than '/'
	tokClass          // "[...]": one byte other than '/' in (or, negated, not in) class
	tokStar           // "*": any run of bytes without '/'
	tokAnyDirs        // "**/": nothing, or anything ending in '/'
	tokAll            // trailing "**": anything
	tokNever          // a malformed bracket expression: matches nothing
)

// parseIgnore parses the text of a .gitignore file the way git does:
// blank lines and lines starting with '#' are skipped, trailing spaces are
// trimmed unless escaped with '\', a leading '!' negates, a trailing '/'
// limits the pattern to directories, and a slash at the start or in the
// middle anchors it to the file's directory.
func parseIgnore(data []byte) []ignoreRule {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	var rules []ignoreRule
	for len(data) > 0 {
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		line = trimTrailingSpaces(line)
		if len(line) == 0 {
			continue
		}
		var r ignoreRule
		if line[0] == '!' {
			r.negate, line = true, line[1:]
		}
		if n := len(line); n > 0 && line[n-1] == '/' {
			r.dirOnly, line = true, line[:n-1]
		}
		if len(line) == 0 {
			continue
		}
		if bytes.IndexByte(line, '/') >= 0 {
			r.anchored = true
			line = bytes.TrimPrefix(line, []byte("/"))
		}
		r.toks = compileGlob(string(line))
		rules = append(rules, r)
	}
	return rules
}

// trimTrailingSpaces drops trailing spaces that no backslash escapes.
func trimTrailingSpaces(b []byte) []byte {
	end := len(b)
	for end > 0 && b[end-1] == ' ' {
		// Count the backslashes before the space: an odd number escapes it.
		n := 0
		for k := end - 2; k >= 0 && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 1 {
			break
		}
		end--
	}
	return b[:end]
}

// compileGlob compiles a gitignore pattern (leading '/' and trailing '/'
// already removed). "**" is special only as a whole path component.
func compileGlob(p string) []globTok {
	var toks []globTok
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch c {
		case '*':
			j := i
			for j < len(p) && p[j] == '*' {
				j++
			}
			whole := j-i >= 2 && (i == 0 || p[i-1] == '/') && (j == len(p) || p[j] == '/')
			switch {
			case whole && j == len(p):
				toks = append(toks, globTok{kind: tokAll})
			case whole:
				toks = append(toks, globTok{kind: tokAnyDirs})
				j++ // the slash
			default:
				toks = append(toks, globTok{kind: tokStar})
			}
			i = j - 1
		case '?':
			toks = append(toks, globTok{kind: tokOne})
		case '[':
			t, n := compileClass(p[i+1:])
			toks = append(toks, t)
			i += n
		case '\\':
			if i+1 < len(p) {
				i++
			}
			toks = append(toks, globTok{kind: tokLit, c: p[i]})
		default:
			toks = append(toks, globTok{kind: tokLit, c: c})
		}
	}
	return toks
}

var posixClasses = map[string]func(c byte) bool{
	"alnum":  func(c byte) bool { return isAlpha(c) || isDigit(c) },
	"alpha":  isAlpha,
	"blank":  func(c byte) bool { return c == ' ' || c == '\t' },
	"cntrl":  func(c byte) bool { return c < 0x20 || c == 0x7f },
	"digit":  isDigit,
	"graph":  func(c byte) bool { return c > 0x20 && c < 0x7f },
	"lower":  func(c byte) bool { return c >= 'a' && c <= 'z' },
	"print":  func(c byte) bool { return c >= 0x20 && c < 0x7f },
	"punct":  func(c byte) bool { return c > 0x20 && c < 0x7f && !isAlpha(c) && !isDigit(c) },
	"space":  func(c byte) bool { return c == ' ' || (c >= '\t' && c <= '\r') },
	"upper":  func(c byte) bool { return c >= 'A' && c <= 'Z' },
	"xdigit": func(c byte) bool { return isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'f') },
}

func isAlpha(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// compileClass compiles the bracket expression after a '[' and returns
// the token and how many bytes of p it used. An unterminated or malformed
// expression matches nothing, as in git.
func compileClass(p string) (globTok, int) {
	t := globTok{kind: tokClass}
	set := func(c byte) { t.class[c>>6] |= 1 << (c & 63) }
	i := 0
	if i < len(p) && (p[i] == '!' || p[i] == '^') {
		t.neg = true
		i++
	}
	for first := true; ; first = false {
		if i >= len(p) {
			return globTok{kind: tokNever}, len(p)
		}
		c := p[i]
		switch {
		case c == ']' && !first:
			return t, i + 1
		case c == '[' && strings.HasPrefix(p[i:], "[:"):
			end := strings.Index(p[i+2:], ":]")
			if end < 0 {
				return globTok{kind: tokNever}, len(p)
			}
			fn := posixClasses[p[i+2:i+2+end]]
			if fn == nil {
				return globTok{kind: tokNever}, len(p)
			}
			for b := 0; b < 256; b++ {
				if fn(byte(b)) {
					set(byte(b))
				}
			}
			i += end + 4
			continue
		case c == '\\':
			i++
			if i >= len(p) {
				return globTok{kind: tokNever}, len(p)
			}
			c = p[i]
		}
		i++
		if i+1 < len(p) && p[i] == '-' && p[i+1] != ']' {
			hi := p[i+1]
			i += 2
			if hi == '\\' {
				if i >= len(p) {
					return globTok{kind: tokNever}, len(p)
				}
				hi = p[i]
				i++
			}
			for b := int(c); b <= int(hi); b++ {
				set(byte(b))
			}
			continue
		}
		set(c)
	}
}

// globMatch reports whether the compiled pattern matches all of s. It
// runs in O(len(toks)·len(s)) time with two rows of len(s)+1 booleans
// (buf is reused between calls), so no pattern can make it backtrack.
func globMatch(toks []globTok, s string, buf *[]bool) bool {
	n := len(s) + 1
	if cap(*buf) < 2*n {
		*buf = make([]bool, 2*n)
	}
	cur, next := (*buf)[:n], (*buf)[n:2*n]
	clear(cur)
	cur[0] = true
	for _, t := range toks {
		clear(next)
		any := false
		switch t.kind {
		case tokLit, tokOne, tokClass:
			for i := 0; i < len(s); i++ {
				if cur[i] && t.one(s[i]) {
					next[i+1] = true
				}
			}
		case tokStar:
			for i := 0; i < n; i++ {
				next[i] = cur[i] || (i > 0 && next[i-1] && s[i-1] != '/')
			}
		case tokAnyDirs:
			seen := false
			for i := 0; i < n; i++ {
				next[i] = cur[i] || (seen && s[i-1] == '/')
				seen = seen || cur[i]
			}
		case tokAll:
			seen := false
			for i := 0; i < n; i++ {
				seen = seen || cur[i]
				next[i] = seen
			}
		}
		for _, v := range next {
			any = any || v
		}
		if !any {
			return false
		}
		cur, next = next, cur
	}
	return cur[len(s)]
}

// one reports whether a single-byte token matches c.
func (t *globTok) one(c byte) bool {
	switch t.kind {
	case tokLit:
		return c == t.c
	case tokOne:
		return c != '/'
	case tokClass:
		in := t.class[c>>6]&(1<<(c&63)) != 0
		return c != '/' && in != t.neg
	}
	return false
}

// ignoreDir is the rules of one .gitignore file, chained to those of the
// directories above it.
type ignoreDir struct {
	parent *ignoreDir
	base   string // directory holding the file, relative to the top ("" for the top)
	rules  []ignoreRule
}

// ignored reports whether path p (relative to the top) is ignored by the
// rules in force: the last matching rule of the deepest file that has
// one decides. Directories above p are assumed not ignored (the walk does
// not descend into ignored directories).
func (d *ignoreDir) ignored(p string, isDir bool, buf *[]bool) bool {
	for ; d != nil; d = d.parent {
		rel := p
		if d.base != "" {
			rel = p[len(d.base)+1:]
		}
		name := rel[strings.LastIndexByte(rel, '/')+1:]
		for i := len(d.rules) - 1; i >= 0; i-- {
			r := &d.rules[i]
			if r.dirOnly && !isDir {
				continue
			}
			s := name
			if r.anchored {
				s = rel
			}
			if globMatch(r.toks, s, buf) {
				return !r.negate
			}
		}
	}
	return false
}
