package main

import (
	"strings"
	"testing"

	"tine/guestagent/proto"
)

// TestShown: names, lines and messages that would steer a terminal (an
// escape sequence, a C1 control, a bidirectional override, a newline,
// bytes that are not UTF-8) are printed escaped; other text, other
// scripts included, as it is.
func TestShown(t *testing.T) {
	for _, c := range []struct{ in, name, line, msg string }{
		{"plain.go", "plain.go", "plain.go", "plain.go"},
		{"héllo wörld", "héllo wörld", "héllo wörld", "héllo wörld"},
		{"a\tb", `"a\tb"`, "a\tb", `a\u0009b`},
		{"r\x1b[1;35mRED", `"r\x1b[1;35mRED"`, `r\u001b[1;35mRED`, `r\u001b[1;35mRED`},
		{"c1\u009b2J", `"c1\u009b2J"`, `c1\u009b2J`, `c1\u009b2J`},
		{"evil\u202egnp.exe", `"evil\u202egnp.exe"`, `evil\u202egnp.exe`, `evil\u202egnp.exe`},
		{"two\nlines", `"two\nlines"`, `two\u000alines`, `two\u000alines`},
		{"bad\xffbyte", `"bad\xffbyte"`, `bad\xffbyte`, `bad\xffbyte`},
		{`back\slash`, `back\slash`, `back\slash`, `back\\slash`},
		{`"two\nlines"`, `"\"two\\nlines\""`, `"two\nlines"`, `"two\\nlines"`},
	} {
		if got := shown(c.in); got != c.name {
			t.Errorf("shown(%q) = %s, want %s", c.in, got, c.name)
		}
		if got := shownLine(c.in + "\n"); got != c.line+"\n" {
			t.Errorf("shownLine(%q) = %q, want %q", c.in, got, c.line+"\n")
		}
		if got := printable(c.in); got != c.msg {
			t.Errorf("printable(%q) = %s, want %s", c.in, got, c.msg)
		}
	}
}

// TestAgentFieldsShown: the agent's answers come from inside the sandbox,
// which may forge them: every string of a ps or ports line is shown
// escaped where it would steer the terminal or forge a line.
func TestAgentFieldsShown(t *testing.T) {
	for _, row := range []string{
		psRow(proto.Process{PID: 2, PPID: 1, User: "root\x1b[2J", State: "S\x1b]0;owned\x07", Argv: []string{"sh\r\nforged"}}),
		psRow(proto.Process{PID: 3, PPID: 1, UID: 5, Comm: "kw\x1b[1m"}),
		portRow(proto.Port{Proto: "tcp\x1b[2J", Address: "0.0.0.0\r\nforged line", Port: 80, PID: 2}, "-"),
	} {
		if strings.ContainsAny(strings.TrimSuffix(row, "\n"), "\x1b\x07\r\n") {
			t.Errorf("row %q steers the terminal", row)
		}
	}
}
