package spec

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// devcontainerDir writes a devcontainer.json under a new project's
// .devcontainer and returns its path.
func devcontainerDir(t *testing.T, doc string) string {
	t.Helper()
	dc := filepath.Join(t.TempDir(), "proj", ".devcontainer")
	os.MkdirAll(dc, 0o755)
	p := filepath.Join(dc, "devcontainer.json")
	os.WriteFile(p, []byte(doc), 0o644)
	return p
}

// TestFeatureOrder: features install in file order, those
// overrideFeatureInstallOrder names first, before the lifecycle commands.
func TestFeatureOrder(t *testing.T) {
	p := devcontainerDir(t, `{"features": {"./c": {}, "./a": {}, "./b": "2.0"},
	  "overrideFeatureInstallOrder": ["./b"], "postCreateCommand": "echo done"}`)
	for _, n := range []string{"a", "b", "c"} {
		writeFeature(t, filepath.Join(filepath.Dir(p), n), `{"id": "`+n+`"}`, "true\n")
	}
	s, err := LoadDevcontainer(t.Context(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, st := range s.Setup {
		names = append(names, st.Name)
	}
	if want := []string{"feature ./b", "feature ./c", "feature ./a", "postCreateCommand"}; !slices.Equal(names, want) {
		t.Errorf("order %q, want %q", names, want)
	}
	if !strings.Contains(s.Setup[0].Run, "'VERSION=2.0'") || !s.Setup[0].Root || len(s.Setup[0].Input) == 0 {
		t.Errorf("a version string: %+v", s.Setup[0])
	}
	p = devcontainerDir(t, `{"features": {"./a": {}}, "overrideFeatureInstallOrder": ["./z"]}`)
	writeFeature(t, filepath.Join(filepath.Dir(p), "a"), `{}`, "true\n")
	if _, err := LoadDevcontainer(t.Context(), p, nil); err == nil || !strings.Contains(err.Error(), `"./z" is not in features`) {
		t.Errorf("unknown id in overrideFeatureInstallOrder: %v", err)
	}
}

// TestFeatureRefused: what does not stay inside the directory of
// devcontainer.json, links out of the feature, and features tine does not
// fetch are refused, naming them.
func TestFeatureRefused(t *testing.T) {
	outside := t.TempDir()
	writeFeature(t, filepath.Join(outside, "evil"), `{}`, "true\n")
	for _, c := range []struct {
		id, want string
		prep     func(dc string)
	}{
		{"../../etc", "must be a directory inside", nil},
		{"..", "must be a directory inside", nil},
		{"./x/../../y", "must be a directory inside", nil},
		{"./linked", "must be a directory inside", func(dc string) { os.Symlink(filepath.Join(outside, "evil"), filepath.Join(dc, "linked")) }},
		{"./sneaky", "install.sh: want a regular file", func(dc string) {
			writeFeature(t, filepath.Join(dc, "sneaky"), `{}`, "")
			os.Remove(filepath.Join(dc, "sneaky", "install.sh"))
			os.Symlink("/etc/passwd", filepath.Join(dc, "sneaky", "install.sh"))
		}},
		{"./leaky", "outside the feature's directory", func(dc string) {
			writeFeature(t, filepath.Join(dc, "leaky"), `{}`, "true\n")
			os.Symlink("../../../../etc/shadow", filepath.Join(dc, "leaky", "data"))
		}},
		{"./fifo", "not a file, directory or link", func(dc string) {
			writeFeature(t, filepath.Join(dc, "fifo"), `{}`, "true\n")
			if err := syscall.Mkfifo(filepath.Join(dc, "fifo", "pipe"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"./noinstall", "install.sh", func(dc string) {
			os.MkdirAll(filepath.Join(dc, "noinstall"), 0o755)
			os.WriteFile(filepath.Join(dc, "noinstall", "devcontainer-feature.json"), []byte("{}"), 0o644)
		}},
		{"./badopt", "option x", func(dc string) { writeFeature(t, filepath.Join(dc, "badopt"), `{}`, "true\n") }},
		{"ghcr.io/devcontainers/features/node:1", "fetched only with a feature cache", nil},
		{"https://example.com/f.tgz", "does not fetch features from URLs", nil},
		{"node:1", `"ghcr.io/devcontainers/features/node:1"`, nil},
		{"/etc", "must be a directory inside", nil},
		{"Bad//Ref", `want a local feature ("./NAME") or an OCI reference`, nil},
	} {
		opts := "{}"
		if c.id == "./badopt" {
			opts = `{"x": [1]}`
		}
		p := devcontainerDir(t, `{"features": {"`+c.id+`": `+opts+`}}`)
		if c.prep != nil {
			c.prep(filepath.Dir(p))
		}
		_, err := LoadDevcontainer(t.Context(), p, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.id, err, c.want)
		}
	}
	// A feature too large.
	p := devcontainerDir(t, `{"features": {"./big": {}}}`)
	writeFeature(t, filepath.Join(filepath.Dir(p), "big"), `{}`, "true\n")
	f, _ := os.Create(filepath.Join(filepath.Dir(p), "big", "blob"))
	f.Truncate(MaxFeatureBytes + 1)
	f.Close()
	if _, err := LoadDevcontainer(t.Context(), p, nil); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a feature over the bound: %v", err)
	}
}

func TestOptionEnvName(t *testing.T) {
	for in, want := range map[string]string{"version": "VERSION", "install-dir": "INSTALL_DIR", "9lives": "_LIVES", "__x.y": "_X_Y", "ok_1": "OK_1"} {
		if got := optionEnvName(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
	if _, err := ParseFeatureMeta([]byte(`{"options": {"a": {"default": {}}}}`)); err == nil {
		t.Errorf("an object default was taken")
	}
	if _, err := ParseFeatureMeta([]byte(`{"containerEnv": {"A B": "x"}}`)); err == nil {
		t.Errorf("a bad containerEnv name was taken")
	}
}
