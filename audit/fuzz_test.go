package audit

import (
	"bytes"
	"os"
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
