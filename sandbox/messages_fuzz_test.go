package sandbox

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzInbox: an inbox file holds what sandboxes sent; whatever its bytes
// (torn, corrupt, crafted), decoding never panics, keeps within the
// bounds, returns only valid messages in growing ID order, and the next
// ID is above every one returned.
func FuzzInbox(f *testing.F) {
	good, _ := encodeMessage(&Message{ID: 7, From: "a", To: "b", Time: time.Unix(1, 0).UTC(), Body: json.RawMessage(`"hi"`)})
	for _, s := range []string{
		"", "\n", string(good), string(good) + string(good),
		`{"next":42}` + "\n" + string(good),
		`{"next":18446744073709551615}` + "\n",
		string(good[:len(good)-5]),
		`{"id":1,"from":"../x","to":"b","time":"2026-01-01T00:00:00Z","body":1}` + "\n",
		`{"id":1,"from":"host","to":"b","time":"2026-01-01T00:00:00Z","body":{"a":[1,2]}}` + "\n",
		`{"id":2,"from":"a","to":"b","body":  1 }` + "\n",
		`{"id":18446744073709551615,"from":"a","to":"b","body":1}` + "\n",
		`{"id":3,"from":"a","to":"b","body":null}` + "\n" + `{"id":3,"from":"a","to":"b","body":"x"}` + "\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in, n := DecodeInbox(b)
		if n < 0 || n > len(b) || (n > 0 && b[n-1] != '\n') {
			t.Fatalf("good length %d of %d bytes", n, len(b))
		}
		if len(in.Messages) > 2*MaxInboxMessages {
			t.Fatalf("%d messages", len(in.Messages))
		}
		var last uint64
		for _, m := range in.Messages {
			if m.ID <= last || m.ID >= in.Next {
				t.Fatalf("ids out of order: %d after %d, next %d", m.ID, last, in.Next)
			}
			last = m.ID
			if !validMessage(&m) || strings.ContainsAny(m.From+m.To, "/\x00") {
				t.Fatalf("invalid message kept: %+v", m)
			}
		}
	})
}

// FuzzInboxRoundTrip: any message tine accepts (a body of any JSON, any
// sender and target name) comes back from its inbox file as it went in,
// after an append and after a rewrite; a torn append loses only itself.
func FuzzInboxRoundTrip(f *testing.F) {
	f.Add("a", "b", `"hello"`, uint64(1), int64(0))
	f.Add("host", "b-1", `{"x":[1,2,{"y":"\u003c/script>"}]}`, uint64(99), int64(1e18))
	f.Add("a.b", "Z", ` [ 1 , 2 ] `, uint64(1<<40), int64(-5))
	f.Add("a", "b", "\"\xff\"", uint64(3), int64(7))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, from, to, body string, id uint64, ns int64) {
		b, err := checkBody([]byte(body))
		if err != nil || id == 0 || id == ^uint64(0) || !nameRE().MatchString(to) || !(from == HostSender || nameRE().MatchString(from)) {
			return
		}
		msg := Message{ID: id, From: from, To: to, Time: time.Unix(0, ns).UTC(), Body: b}
		if msg.Time.Year() < 1 || msg.Time.Year() > 9999 {
			return
		}
		line, err := encodeMessage(&msg)
		if err != nil {
			t.Fatal(err)
		}
		check := func(what string, in Inbox) {
			t.Helper()
			if len(in.Messages) != 1 {
				t.Fatalf("%s: %d messages from %q", what, len(in.Messages), line)
			}
			g := in.Messages[0]
			if g.ID != msg.ID || g.From != msg.From || g.To != msg.To || !g.Time.Equal(msg.Time) || !bytes.Equal(g.Body, msg.Body) || in.Next != id+1 {
				t.Fatalf("%s: got %+v (next %d), want %+v", what, g, in.Next, msg)
			}
		}
		in, n := DecodeInbox(line)
		check("decode", in)
		if n != len(line) {
			t.Fatalf("good %d of %d", n, len(line))
		}
		torn, n := DecodeInbox(append(append([]byte{}, line...), line[:len(line)/2]...))
		check("torn", torn)
		if n != len(line) {
			t.Fatalf("torn: good %d, want %d", n, len(line))
		}
		p := filepath.Join(dir, "inbox.jsonl")
		if err := rewriteInbox(p, in); err != nil {
			t.Fatal(err)
		}
		back, _, err := readInbox(p)
		if err != nil {
			t.Fatal(err)
		}
		check("rewrite", back)
	})
}

// TestMessagePolicyParse: the policy's forms and what is refused.
func TestMessagePolicyParse(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", "family"}, {"family", "family"}, {"none", "none"}, {" family , w-* ", "family,w-*"},
		{"family,a?,a?,[ab]*", "family,a?,[ab]*"}, {"worker-*", "worker-*"},
	} {
		p, err := ParseMessagePolicy(c.in)
		if err != nil || p.String() != c.want {
			t.Errorf("%q: %v %v, want %q", c.in, p, err, c.want)
		}
	}
	many := "family"
	for i := range 17 {
		many += ",a" + string(rune('a'+i))
	}
	for _, in := range []string{"none,family", "family,", "a/b", "../x", "[", "family,a b", "x\x00", many, strings.Repeat("a", 65)} {
		if p, err := ParseMessagePolicy(in); err == nil {
			t.Errorf("%q: accepted as %v", in, p)
		}
	}
}
