package pathjson

import (
	"encoding/json"
	"testing"
)

// FuzzRoundTrip: any path a sandbox can name survives JSON exactly when
// it travels with its B64 form.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"a/b.txt", "x\xffy", "é", "\xed\xa0\x80", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		type pair struct {
			Path string `json:"path"`
			B64  string `json:"path_b64,omitempty"`
		}
		b, err := json.Marshal(pair{p, B64(p)})
		if err != nil {
			t.Fatal(err)
		}
		var back pair
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if got := Exact(back.Path, back.B64); got != p {
			t.Fatalf("%q came back as %q", p, got)
		}
	})
}

func TestExactIgnoresBadB64(t *testing.T) {
	if got := Exact("a", "!!"); got != "a" {
		t.Fatalf("Exact with bad base64 = %q, want the text form", got)
	}
	if B64("plain") != "" {
		t.Fatal("B64 of UTF-8 text is not empty")
	}
}
