package spec

import (
	"encoding/json"
	"strings"
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
	f.Add([]byte(`{"features": {"./a": {"x": 1}, "b:1": "2", "./a": {}}, "overrideFeatureInstallOrder": ["b"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := ParseDevcontainer(b); err == nil {
			var dc devcontainer
			if json.Unmarshal(StripJSONC(b), &dc) == nil && isSet(dc.InitializeCommand) {
				t.Fatalf("%q: initializeCommand accepted", b)
			}
		}
	})
}

// FuzzParseFeatureMeta: a feature's devcontainer-feature.json comes with
// a cloned repository; decoding never panics, and what it accepts gives
// values and names install.sh can receive.
func FuzzParseFeatureMeta(f *testing.F) {
	f.Add([]byte(featureMeta))
	f.Add([]byte(`{"options": {"a": {"default": 1e400}}}`))
	f.Add([]byte(`{"containerEnv": {"PATH": "${PATH"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseFeatureMeta(b)
		if err != nil {
			return
		}
		for name, o := range m.Options {
			if !envRE.MatchString(optionEnvName(name)) {
				t.Fatalf("option %q gives variable %q", name, optionEnvName(name))
			}
			if isSet(o.Default) {
				if v, err := optionValue(o.Default); err != nil || strings.ContainsRune(v, 0) {
					t.Fatalf("default %s: %q %v", o.Default, v, err)
				}
			}
		}
		for _, v := range m.ContainerEnv {
			expandEnv(v, map[string]string{})
		}
	})
}
