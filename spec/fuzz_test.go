package spec

import (
	"encoding/json"
	"testing"
)

// FuzzParse: a spec file is user input; parsing never panics.
func FuzzParse(f *testing.F) {
	f.Add([]byte(full))
	f.Add([]byte("setup: [a, {run: b}]\n"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if s, err := Parse(b); err == nil {
			s.EnvList()
		}
	})
}

// FuzzParseDevcontainer: a devcontainer.json often comes with a cloned
// repository; parsing never panics, and initializeCommand is never let
// through.
func FuzzParseDevcontainer(f *testing.F) {
	f.Add([]byte(devc))
	f.Add([]byte(`{"initializeCommand": "x"}`))
	f.Add([]byte(`{"a": "/*", // "b"`))
	f.Add([]byte(`"\`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := ParseDevcontainer(b); err == nil {
			var dc devcontainer
			if json.Unmarshal(StripJSONC(b), &dc) == nil && isSet(dc.InitializeCommand) {
				t.Fatalf("%q: initializeCommand accepted", b)
			}
		}
	})
}
