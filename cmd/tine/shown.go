package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A sandbox names its files and processes, and writes their contents and
// its messages: printed raw, an escape sequence in them would steer the
// terminal of the person reading tine's output (move the cursor, erase
// lines, set the window title), a newline would forge a line, and a
// bidirectional override would make a name read as another. Text for
// people goes through shown (names), shownLine (lines of content) or
// printable (message bodies).

// unsafeRune reports a rune a terminal does not just print: a control
// (C0, DEL, C1), a format character (bidirectional overrides and
// isolates, zero-width ones) or a line or paragraph separator.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// shown is name as it is safe to print: itself, or Go-quoted when it
// holds an unsafe rune, is not valid UTF-8 or begins with a double quote
// (so that a name printed with quotes is always one that was quoted).
func shown(name string) string {
	if !utf8.ValidString(name) || strings.IndexFunc(name, unsafeRune) >= 0 || strings.HasPrefix(name, `"`) {
		return strconv.Quote(name)
	}
	return name
}

// shownAll is shown of each name, joined by sep.
func shownAll(names []string, sep string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = shown(n)
	}
	return strings.Join(out, sep)
}

// shownLine is a line of content with each unsafe rune but a tab, and
// each byte that is not UTF-8, written as an escape (\u001b, \xff); a
// final newline stays.
func shownLine(l string) string {
	body, nl := strings.CutSuffix(l, "\n")
	out := escaped(body, false)
	if nl {
		out += "\n"
	}
	return out
}

// printable is s with every unsafe rune and every byte that is not UTF-8
// escaped and backslashes doubled, so that it reads back unambiguously.
func printable(s string) string { return escaped(s, true) }

// escaped writes the unsafe runes (tabs too, with all) and the bytes that
// are not UTF-8 of s as escapes, and with all doubles backslashes.
func escaped(s string, all bool) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case all && r == '\\':
			b.WriteString(`\\`)
		case unsafeRune(r) && (all || r != '\t'):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
