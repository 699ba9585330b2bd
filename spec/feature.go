package spec

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Bounds on a devcontainer feature: its directory is copied into the
// sandbox whole, and a spec comes with a cloned repository.
const (
	// MaxFeatureBytes bounds the bytes of a feature directory's files.
	MaxFeatureBytes = 16 << 20
	// MaxFeatureEntries bounds the files, directories and links in one.
	MaxFeatureEntries = 4096
	// MaxFeatures bounds the features of one devcontainer.json.
	MaxFeatures = 64
	// maxFeatureOptions bounds the options of one feature.
	maxFeatureOptions = 256
)

// FeatureMeta is the part of devcontainer-feature.json tine reads.
// installsAfter and dependsOn are read only to be reported; the fields
// that change the container itself (mounts, privileged, capAdd, init,
// entrypoint, securityOpt) and a feature's lifecycle commands are not
// honoured.
type FeatureMeta struct {
	ID            string                   `json:"id"`
	Version       string                   `json:"version"`
	Options       map[string]FeatureOption `json:"options"`
	ContainerEnv  map[string]string        `json:"containerEnv"`
	InstallsAfter []string                 `json:"installsAfter"`
	DependsOn     map[string]any           `json:"dependsOn"`
}

// FeatureOption is one declared option: its type and default.
type FeatureOption struct {
	Type    string          `json:"type"`
	Default json.RawMessage `json:"default"`
}

// ParseFeatureMeta decodes a devcontainer-feature.json (JSON with
// comments), bounded like a spec file.
func ParseFeatureMeta(b []byte) (*FeatureMeta, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("devcontainer-feature.json larger than %d bytes", MaxFileBytes)
	}
	var m FeatureMeta
	if err := json.Unmarshal(StripJSONC(b), &m); err != nil {
		return nil, fmt.Errorf("devcontainer-feature.json: %w", err)
	}
	if len(m.Options) > maxFeatureOptions {
		return nil, fmt.Errorf("devcontainer-feature.json: %d options; at most %d", len(m.Options), maxFeatureOptions)
	}
	for name, o := range m.Options {
		if !envRE.MatchString(optionEnvName(name)) {
			return nil, fmt.Errorf("devcontainer-feature.json: option %q: want a name of letters, digits, _ and -", name)
		}
		if isSet(o.Default) {
			if _, err := optionValue(o.Default); err != nil {
				return nil, fmt.Errorf("devcontainer-feature.json: options.%s.default: %w", name, err)
			}
		}
	}
	for k := range m.ContainerEnv {
		if !envRE.MatchString(k) {
			return nil, fmt.Errorf("devcontainer-feature.json: containerEnv %q: want a name of [A-Za-z_][A-Za-z0-9_]*", k)
		}
	}
	return &m, nil
}

// optionValue is an option's value as install.sh sees it: a string as it
// is, a boolean or number as JSON writes it.
func optionValue(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if strings.ContainsRune(s, 0) {
			return "", errors.New("a NUL byte cannot be passed in the environment")
		}
		return s, nil
	}
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		return fmt.Sprint(b), nil
	}
	var n json.Number
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if d.Decode(&n) == nil {
		return n.String(), nil
	}
	return "", fmt.Errorf("%s: want a string, a boolean or a number", raw)
}

// optionEnvName is the variable an option reaches install.sh in: upper
// case, each character other than a letter, digit or _ made _, and a
// leading run of digits and _ made one _.
func optionEnvName(opt string) string {
	b := []byte(strings.ToUpper(opt))
	for i, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	s := string(b)
	if t := strings.TrimLeft(s, "0123456789_"); t != s {
		s = "_" + t
	}
	return s
}

// orderedObject reads a JSON object's members in the order written,
// refusing a name given twice.
func orderedObject(raw json.RawMessage) ([]string, []json.RawMessage, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, errors.New("want an object")
	}
	var keys []string
	var vals []json.RawMessage
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, nil, err
		}
		k, _ := tok.(string)
		if slices.Contains(keys, k) {
			return nil, nil, fmt.Errorf("%q given twice", k)
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, nil, err
		}
		keys, vals = append(keys, k), append(vals, v)
	}
	return keys, vals, nil
}

// featureRef is one entry of a devcontainer.json's features.
type featureRef struct {
	id      string
	options map[string]json.RawMessage
}

// readFeatures reads the features object in file order, then puts the
// ids overrideFeatureInstallOrder names first, in its order.
func readFeatures(raw, override json.RawMessage) ([]featureRef, error) {
	if !isSet(raw) {
		return nil, nil
	}
	keys, vals, err := orderedObject(raw)
	if err != nil {
		return nil, fmt.Errorf("features: %w", err)
	}
	if len(keys) > MaxFeatures {
		return nil, fmt.Errorf("features: %d; at most %d", len(keys), MaxFeatures)
	}
	refs := make([]featureRef, len(keys))
	for i, k := range keys {
		refs[i].id = k
		var version string
		switch {
		case json.Unmarshal(vals[i], &refs[i].options) == nil:
		case json.Unmarshal(vals[i], &version) == nil:
			// A string is the feature's version option.
			refs[i].options = map[string]json.RawMessage{"version": vals[i]}
		default:
			return nil, fmt.Errorf("features.%s: want an object of options or a version string", k)
		}
		if len(refs[i].options) > maxFeatureOptions {
			return nil, fmt.Errorf("features.%s: %d options; at most %d", k, len(refs[i].options), maxFeatureOptions)
		}
	}
	if !isSet(override) {
		return refs, nil
	}
	var order []string
	if err := json.Unmarshal(override, &order); err != nil {
		return nil, fmt.Errorf("overrideFeatureInstallOrder: want an array of feature ids")
	}
	var first []featureRef
	for _, id := range order {
		i := slices.IndexFunc(refs, func(r featureRef) bool { return r.id == id || withoutTag(r.id) == id })
		if i < 0 {
			return nil, fmt.Errorf("overrideFeatureInstallOrder: %q is not in features", id)
		}
		first = append(first, refs[i])
		refs = slices.Delete(refs, i, i+1)
	}
	return append(first, refs...), nil
}

// withoutTag is an OCI feature id without its :tag or @digest.
func withoutTag(id string) string {
	if i := strings.LastIndexAny(id, ":@"); i > strings.LastIndex(id, "/") {
		return id[:i]
	}
	return id
}

func isLocalFeature(id string) bool {
	return strings.HasPrefix(id, "./") || strings.HasPrefix(id, "../") || id == "." || id == ".."
}

// featureUsers are the users devcontainer.json names, for install.sh's
// _REMOTE_USER and _CONTAINER_USER.
type featureUsers struct{ remote, container string }

// featureSteps turns the features into setup steps. dir is the directory
// holding devcontainer.json; a local feature is a directory under it.
// Each feature's containerEnv is added to env.
// OCI features are fetched with fetch.
func featureSteps(ctx context.Context, refs []featureRef, dir string, fetch *FeatureFetcher, users featureUsers, env map[string]string) ([]Step, error) {
	var steps []Step
	for _, r := range refs {
		var fdir string
		var err error
		switch {
		case strings.Contains(r.id, "://"):
			return nil, fmt.Errorf("features: %q: tine does not fetch features from URLs: use an OCI reference, or copy the feature's directory next to devcontainer.json and name it \"./NAME\"", r.id)
		case isLocalFeature(r.id) || strings.HasPrefix(r.id, "/"):
			fdir, err = localFeatureDir(dir, r.id)
		case !strings.Contains(r.id, "/"):
			return nil, fmt.Errorf("features: %q: a short feature id is the format's old form; name it in full, such as \"ghcr.io/devcontainers/features/%s:1\"", r.id, withoutTag(r.id))
		default:
			fdir, err = fetch.fetch(ctx, r.id)
		}
		if err != nil {
			return nil, err
		}
		st, err := featureStep(r, fdir, users, env)
		if err != nil {
			return nil, fmt.Errorf("features: %s: %w", r.id, err)
		}
		steps = append(steps, st)
	}
	return steps, nil
}

// localFeatureDir resolves a local feature's id to its directory, which
// must lie under dir, symbolic links followed.
func localFeatureDir(dir, id string) (string, error) {
	refuse := func() (string, error) {
		return "", fmt.Errorf("features: %q: a local feature must be a directory inside %s; tine does not read outside it", id, dir)
	}
	rel := filepath.Clean(filepath.FromSlash(id))
	if rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return refuse()
	}
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(filepath.Join(dir, rel))
	if err != nil {
		return "", fmt.Errorf("features: %q: %w", id, err)
	}
	if r, err := filepath.Rel(realDir, real); err != nil || r == "." || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
		return refuse()
	}
	return real, nil
}

// featureStep reads a feature directory and makes the setup step that
// installs it: the directory travels as a tar stream on the step's
// standard input, is unpacked into a fresh directory, and its install.sh
// runs there as root with the options in its environment, each quoted so
// that a value is only ever a value.
func featureStep(r featureRef, fdir string, users featureUsers, env map[string]string) (Step, error) {
	mb, err := readBounded(filepath.Join(fdir, "devcontainer-feature.json"))
	if err != nil {
		return Step{}, err
	}
	meta, err := ParseFeatureMeta(mb)
	if err != nil {
		return Step{}, err
	}
	if fi, err := os.Lstat(filepath.Join(fdir, "install.sh")); err != nil {
		return Step{}, fmt.Errorf("install.sh: %w", err)
	} else if !fi.Mode().IsRegular() {
		return Step{}, errors.New("install.sh: want a regular file (a symbolic link is refused)")
	}
	archive, err := featureArchive(fdir)
	if err != nil {
		return Step{}, err
	}
	vars := map[string]string{}
	names := map[string]string{}
	set := func(opt string, raw json.RawMessage) error {
		v, err := optionValue(raw)
		if err != nil {
			return fmt.Errorf("option %s: %w", opt, err)
		}
		n := optionEnvName(opt)
		if !envRE.MatchString(n) {
			return fmt.Errorf("option %q: want a name of letters, digits, _ and -", opt)
		}
		if other, ok := names[n]; ok && other != opt {
			return fmt.Errorf("options %s and %s both become $%s", other, opt, n)
		}
		names[n], vars[n] = opt, v
		return nil
	}
	for opt, o := range meta.Options {
		if _, given := r.options[opt]; !given && isSet(o.Default) {
			if err := set(opt, o.Default); err != nil {
				return Step{}, err
			}
		}
	}
	for opt, raw := range r.options {
		if err := set(opt, raw); err != nil {
			return Step{}, err
		}
	}
	if users.remote == "" {
		users.remote = users.container
	}
	if users.container != "" {
		vars["_CONTAINER_USER"] = users.container
	}
	if users.remote != "" {
		vars["_REMOTE_USER"] = users.remote
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	assign := make([]string, len(keys))
	for i, k := range keys {
		assign[i] = k + "=" + vars[k]
	}
	for k, v := range meta.ContainerEnv {
		if v, ok := expandEnv(v, env); ok {
			env[k] = v
		}
	}
	run := `set -e; d=$(mktemp -d); tar -x -f - -C "$d"; cd "$d"; chmod +x ./install.sh; env ` +
		shellJoin(assign) + ` ./install.sh; cd /; rm -rf "$d"`
	return Step{Name: "feature " + r.id, Run: run, Input: archive, Root: true}, nil
}

// expandEnv resolves ${NAME} and ${containerEnv:NAME} in a feature's
// containerEnv value against env (PATH defaulting to the standard one).
// A reference to anything else, or to an unset name, drops the value.
func expandEnv(v string, env map[string]string) (string, bool) {
	ok := true
	out := os.Expand(v, func(ref string) string {
		name := strings.TrimPrefix(ref, "containerEnv:")
		if !envRE.MatchString(name) {
			ok = false
			return ""
		}
		if val, set := env[name]; set {
			return val
		}
		if name == "PATH" {
			return defaultPath
		}
		ok = false
		return ""
	})
	return out, ok
}

// featureArchive is the feature directory as a tar stream, entries in
// lexical order with no times or owners, so that the same content gives
// the same bytes. Only files, directories and links that stay inside
// the directory are taken; sizes and counts are bounded.
func featureArchive(fdir string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var total int64
	entries := 0
	err := filepath.WalkDir(fdir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(fdir, p)
		if err != nil || rel == "." {
			return err
		}
		if entries++; entries > MaxFeatureEntries {
			return fmt.Errorf("more than %d entries", MaxFeatureEntries)
		}
		fi, err := de.Info()
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		hdr := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm())}
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		case fi.Mode().IsRegular():
			if total += fi.Size(); total > MaxFeatureBytes {
				return fmt.Errorf("larger than %d bytes", MaxFeatureBytes)
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			t := filepath.Join(filepath.Dir(rel), target)
			if filepath.IsAbs(target) || t == ".." || strings.HasPrefix(t, ".."+string(filepath.Separator)) {
				return fmt.Errorf("%s: a link to %s, outside the feature's directory", name, target)
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		default:
			return fmt.Errorf("%s: not a file, directory or link", name)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("feature directory %s: %w", fdir, err)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
