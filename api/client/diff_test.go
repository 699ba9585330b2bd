package client

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"tine/api"
)

// TestDecodeArray: a diff larger than the bound on a whole JSON answer
// (maxResponseBytes) is decoded change by change; a cut answer, one that
// is not an array, and fn's error all stop it with an error.
func TestDecodeArray(t *testing.T) {
	const n = 800_000 // about 73 MB of JSON
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("["))
		for i := range n {
			sep := ","
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(pw, `%s{"path":"node_modules/pkg-%d/lib/index.js","kind":"added","type":"file","size":%d}`, sep, i, i)
		}
		pw.Write([]byte("]\n"))
		pw.Close()
	}()
	cr := &countingReader{r: pr}
	got, last := 0, api.Change{}
	err := decodeArray(cr, func(c api.Change) error {
		got++
		last = c
		return nil
	})
	if err != nil || got != n || last.Size != n-1 || last.Kind != "added" {
		t.Fatalf("decoded %d of %d changes (last %+v): %v", got, n, last, err)
	}
	if cr.n <= maxResponseBytes {
		t.Fatalf("the stream was %d bytes, not past the %d-byte bound it tests", cr.n, maxResponseBytes)
	}

	for _, bad := range []string{`[{"path":"a","kind":"added"},{"path":"b"`, `{"error":"x"}`, ``, `[{"path":"a"}`} {
		if err := decodeArray(strings.NewReader(bad), func(api.Change) error { return nil }); err == nil {
			t.Errorf("%q: decoded without an error", bad)
		}
	}
	stop := errors.New("stop")
	if err := decodeArray(strings.NewReader(`[{"path":"a"},{"path":"b"}]`), func(api.Change) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("fn's error: %v", err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += n
	return n, err
}
