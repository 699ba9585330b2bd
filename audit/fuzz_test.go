package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzVerify feeds arbitrary bytes to the log decoder: it must not panic,
// and whatever it takes as whole must re-verify the same.
func FuzzVerify(f *testing.F) {
	p := writeLog(f, 3)
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Add([]byte(""))
	f.Add([]byte("\n"))
	f.Add([]byte(`{"seq":0,"time":"2026-01-01T00:00:00Z","kind":"x","prev":"` + ZeroHash + `","hash":"` + ZeroHash + `"}` + "\n"))
	f.Add(bytes.Repeat([]byte("a"), MaxRecord+10))
	f.Fuzz(func(t *testing.T, data []byte) {
		rep := Verify(bytes.NewReader(data), nil)
		if rep.OK() {
			again := Verify(bytes.NewReader(data), &rep.Head)
			if !again.OK() || again.Records != rep.Records {
				t.Fatalf("a whole log fails against its own head: %v", again.Problems)
			}
		}
		ReadAll(bytes.NewReader(data), 0, func(*Record) error { return nil })
		for _, line := range bytes.Split(data, []byte("\n")) {
			if r, err := ParseRecord(line); err == nil {
				l, _, err := encode(r.Seq, r.Time, r.Kind, r.Fields, r.Prev)
				if err != nil || !bytes.Equal(l[:len(l)-1], line) {
					t.Fatalf("a parsed record does not encode back: %q", line)
				}
			}
		}
	})
}

// FuzzHead: a head from the head file or an API query parses to what
// String writes back, its hash in lower case as records hold it; the last
// record of any log file either parses or is an error.
func FuzzHead(f *testing.F) {
	f.Add("3 "+ZeroHash, []byte(""))
	f.Add("5 "+strings.Repeat("AB", 32), []byte("x\n"))
	f.Add(" 7\t"+ZeroHash+"\n", []byte("{}\n"))
	f.Add("-2 "+ZeroHash, bytes.Repeat([]byte("a"), MaxRecord+10))
	p := writeLog(f, 2)
	b, _ := os.ReadFile(p)
	f.Add("1 x", b)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, s string, log []byte) {
		if h, err := ParseHead(s); err == nil {
			again, err := ParseHead(h.String())
			if err != nil || again != h || h.Hash != strings.ToLower(h.Hash) {
				t.Fatalf("head %q parsed as %v, which reads back as %v (%v)", s, h, again, err)
			}
		}
		name := filepath.Join(dir, "log")
		if err := os.WriteFile(name, log, 0o600); err != nil {
			t.Fatal(err)
		}
		fh, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		if h, err := lastHead(fh); err == nil && h.Seq >= 0 {
			if _, err := ParseHead(h.String()); err != nil {
				t.Fatalf("the last record's head %v does not parse: %v", h, err)
			}
		}
	})
}
