package cowfs

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzPathReasonJSON: a Conflict's and a Refusal's path, any bytes a
// sandbox can name, comes back from JSON exactly.
func FuzzPathReasonJSON(f *testing.F) {
	f.Add("a/b", "why")
	f.Add("x\xffy", "setuid bit dropped")
	f.Fuzz(func(t *testing.T, path, reason string) {
		b, err := json.Marshal([]any{Conflict{path, reason}, Refusal{path, reason}})
		if err != nil {
			t.Fatal(err)
		}
		var c Conflict
		var r Refusal
		if err := json.Unmarshal(b, &[]any{&c, &r}); err != nil {
			t.Fatal(err)
		}
		if c.Path != path || r.Path != path {
			t.Fatalf("path %q came back as %q and %q", path, c.Path, r.Path)
		}
		if (utf8.ValidString(reason) && c.Reason != reason) || r.Reason != c.Reason {
			t.Fatalf("reason %q came back as %q and %q", reason, c.Reason, r.Reason)
		}
	})
}

func TestRefusalJSONNamesBytes(t *testing.T) {
	b, _ := json.Marshal(Refusal{"x\xffy", "r"})
	if want := `{"path":"x\ufffdy","path_b64":"eP95","reason":"r"}`; string(b) != want {
		t.Fatalf("got %s, want %s", b, want)
	}
	b, _ = json.Marshal(Conflict{"a", "r"})
	if want := `{"path":"a","reason":"r"}`; string(b) != want {
		t.Fatalf("got %s, want %s", b, want)
	}
}
