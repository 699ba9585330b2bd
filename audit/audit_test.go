package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func writeLog(t testing.TB, n int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "a.jsonl")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := l.Append("exec", map[string]any{"argv": []string{"echo", strings.Repeat("x", i)}, "exit": i}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	return p
}

func verify(t *testing.T, p string) *Report {
	t.Helper()
	rep, err := VerifyFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestAppendVerifyReopen(t *testing.T) {
	p := writeLog(t, 5)
	rep := verify(t, p)
	if !rep.OK() || rep.Records != 5 || rep.Head.Seq != 4 {
		t.Fatalf("report %+v", rep)
	}
	// Reopening continues the chain.
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Append("stop", nil); err != nil {
		t.Fatal(err)
	}
	l.Close()
	rep = verify(t, p)
	if !rep.OK() || rep.Records != 6 {
		t.Fatalf("report after reopen %+v", rep)
	}
	var kinds []string
	f, _ := os.Open(p)
	defer f.Close()
	if err := ReadAll(f, 4, func(r *Record) error { kinds = append(kinds, r.Kind); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(kinds, ",") != "exec,stop" {
		t.Fatalf("records from 4: %v", kinds)
	}
}

func TestConcurrentAppends(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.jsonl")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				if err := l.Append("k", map[string]any{"i": i, "j": j}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	l.Close()
	if rep := verify(t, p); !rep.OK() || rep.Records != 400 {
		t.Fatalf("report %+v", rep)
	}
}

// TestTamper changes, removes, reorders and cuts records, and checks
// that each is reported.
func TestTamper(t *testing.T) {
	cases := map[string]func([][]byte) [][]byte{
		"edit a field": func(ls [][]byte) [][]byte {
			ls[2] = bytes.Replace(ls[2], []byte(`"exit":2`), []byte(`"exit":0`), 1)
			return ls
		},
		"edit and rehash one record": func(ls [][]byte) [][]byte {
			r, _ := ParseRecord(ls[2])
			line, _, _ := encode(r.Seq, r.Time, "other", r.Fields, r.Prev)
			ls[2] = line[:len(line)-1]
			return ls
		},
		"remove a middle record":  func(ls [][]byte) [][]byte { return append(ls[:3:3], ls[4:]...) },
		"remove the first record": func(ls [][]byte) [][]byte { return ls[1:] },
		"swap two records": func(ls [][]byte) [][]byte {
			ls[1], ls[2] = ls[2], ls[1]
			return ls
		},
		"truncate the end":         func(ls [][]byte) [][]byte { return ls[:4] },
		"truncate everything":      func(ls [][]byte) [][]byte { return nil },
		"duplicate a record":       func(ls [][]byte) [][]byte { return append(ls[:3:3], ls[2:]...) },
		"add a key":                func(ls [][]byte) [][]byte { ls[1] = append([]byte(`{"x":1,`), ls[1][1:]...); return ls },
		"cut the last line midway": func(ls [][]byte) [][]byte { ls[5] = ls[5][:20]; return ls },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			p := writeLog(t, 6)
			if rep := verify(t, p); !rep.OK() {
				t.Fatalf("untouched log: %v", rep.Problems)
			}
			b, _ := os.ReadFile(p)
			lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
			lines = mod(lines)
			out := bytes.Join(lines, []byte("\n"))
			if len(lines) > 0 && name != "cut the last line midway" {
				out = append(out, '\n')
			}
			if err := os.WriteFile(p, out, 0o600); err != nil {
				t.Fatal(err)
			}
			rep := verify(t, p)
			if rep.OK() {
				t.Fatalf("%s: not detected (%d records)", name, rep.Records)
			}
			t.Logf("%s: %s", name, rep.Problems[0])
		})
	}
}

// TestRewriteCaughtByAnchor: a whole chain written anew, head file
// included, passes against its own head but not against an anchor kept
// elsewhere.
func TestRewriteCaughtByAnchor(t *testing.T) {
	p := writeLog(t, 3)
	anchor := verify(t, p).Head
	os.Remove(p)
	os.Remove(HeadPath(p))
	l, _ := Open(p)
	for range 3 {
		l.Append("exec", map[string]any{"argv": []string{"true"}})
	}
	l.Close()
	if rep := verify(t, p); !rep.OK() {
		t.Fatalf("rewritten log against its own head: %v", rep.Problems)
	}
	f, _ := os.Open(p)
	defer f.Close()
	if rep := Verify(f, &anchor); rep.OK() {
		t.Fatal("rewritten log passes against the old anchor")
	}
}

func TestOpenRefusesDamagedEnd(t *testing.T) {
	p := writeLog(t, 2)
	f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":2,"ti`)
	f.Close()
	if _, err := Open(p); err == nil {
		t.Fatal("Open continued a log whose last record is cut")
	}
}

func TestHeadRoundTrip(t *testing.T) {
	h := Head{Seq: 7, Hash: ZeroHash}
	got, err := ParseHead(h.String())
	if err != nil || got != h {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"", "1", "x " + ZeroHash, "-2 " + ZeroHash, "1 zz"} {
		if _, err := ParseHead(bad); err == nil {
			t.Errorf("ParseHead(%q) took it", bad)
		}
	}
}

func TestTooBig(t *testing.T) {
	l, _ := Open(filepath.Join(t.TempDir(), "a"))
	defer l.Close()
	if err := l.Append("x", map[string]any{"b": strings.Repeat("a", MaxRecord)}); err == nil {
		t.Fatal("a record over MaxRecord was taken")
	}
	if err := l.Append("x", map[string]any{"ok": true}); err != nil {
		t.Fatal(err)
	}
}

// Close wakes whoever waits for the next append and refuses later
// appends; the head file says the last record, and a log opened again
// chains on from it.
func TestCloseWakesAndRefuses(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := l.Append("x", map[string]any{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	ch := l.Changed()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Error("Close did not wake a waiter on Changed")
	}
	if err := l.Append("x", nil); err == nil {
		t.Error("an append after Close was taken")
	}
	h, ok, err := ReadHead(p)
	if err != nil || !ok || h.Seq != 2 {
		t.Fatalf("head file after 3 records: %+v %v %v, want seq 2", h, ok, err)
	}
	l2, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if err := l2.Append("y", nil); err != nil {
		t.Fatal(err)
	}
	if rep, err := VerifyFile(p); err != nil || len(rep.Problems) != 0 {
		t.Fatalf("verify after a reopen: %+v %v", rep, err)
	}
}
