package spec

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"sort"
	"strings"
)

// devcontainer is the part of devcontainer.json tine reads.
type devcontainer struct {
	Name                 string            `json:"name"`
	Image                string            `json:"image"`
	Build                json.RawMessage   `json:"build"`
	DockerFile           string            `json:"dockerFile"`
	DockerComposeFile    json.RawMessage   `json:"dockerComposeFile"`
	Features             json.RawMessage   `json:"features"`
	FeatureOrder         json.RawMessage   `json:"overrideFeatureInstallOrder"`
	RemoteUser           string            `json:"remoteUser"`
	ContainerUser        string            `json:"containerUser"`
	ContainerEnv         map[string]string `json:"containerEnv"`
	RemoteEnv            map[string]string `json:"remoteEnv"`
	ForwardPorts         []json.RawMessage `json:"forwardPorts"`
	InitializeCommand    json.RawMessage   `json:"initializeCommand"`
	OnCreateCommand      json.RawMessage   `json:"onCreateCommand"`
	UpdateContentCommand json.RawMessage   `json:"updateContentCommand"`
	PostCreateCommand    json.RawMessage   `json:"postCreateCommand"`
	PostStartCommand     json.RawMessage   `json:"postStartCommand"`
}

// LoadDevcontainer reads a devcontainer.json. The project directory is
// the one holding .devcontainer/ (or the file's own directory for a
// .devcontainer.json at a project's top). initializeCommand, which the
// format runs on the host, is refused: nothing from the file runs outside
// a sandbox. Features become the first setup steps (feature.go): local
// ones (directories beside the file, "./NAME") and OCI ones, which fetch
// fetches (nil: OCI features are refused).
func LoadDevcontainer(ctx context.Context, path string, fetch *FeatureFetcher) (*Spec, error) {
	b, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	s, err := parseDevcontainer(ctx, b, filepath.Dir(abs), fetch)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dir := filepath.Dir(abs)
	if filepath.Base(dir) == ".devcontainer" {
		dir = filepath.Dir(dir)
	}
	s.resolveDir(dir)
	return s, nil
}

// ParseDevcontainer converts a devcontainer.json document (JSON with
// comments and trailing commas) into a Spec. Without the file's
// directory, its features cannot be read: they are left Pending
// (LoadDevcontainer reads them).
func ParseDevcontainer(b []byte) (*Spec, error) {
	return parseDevcontainer(context.Background(), b, "", nil)
}

// parseDevcontainer is ParseDevcontainer with the directory holding the
// file ("": unknown).
func parseDevcontainer(ctx context.Context, b []byte, dir string, fetch *FeatureFetcher) (*Spec, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("devcontainer.json larger than %d bytes", MaxFileBytes)
	}
	var dc devcontainer
	if err := json.Unmarshal(StripJSONC(b), &dc); err != nil {
		return nil, fmt.Errorf("devcontainer.json: %w", err)
	}
	if isSet(dc.InitializeCommand) {
		return nil, fmt.Errorf("devcontainer.json: initializeCommand runs on the host, before any container, with the user's rights; tine never runs a spec's command outside a sandbox: move it into onCreateCommand or postCreateCommand, or run it yourself")
	}
	s := &Spec{Env: map[string]string{}}
	for k, v := range dc.ContainerEnv {
		s.Env[k] = v
	}
	for k, v := range dc.RemoteEnv {
		if strings.Contains(v, "${") {
			continue // references to the container's own variables
		}
		s.Env[k] = v
	}
	if len(s.Env) == 0 {
		s.Env = nil
	}
	s.Base.Image = dc.Image
	var pending []string
	if isSet(dc.Build) || dc.DockerFile != "" {
		pending = append(pending, "build: tine does not build Dockerfiles; give an image, or install what the Dockerfile does in onCreateCommand")
	}
	if isSet(dc.DockerComposeFile) {
		pending = append(pending, "dockerComposeFile: tine does not run compose projects")
	}
	refs, err := readFeatures(dc.Features, dc.FeatureOrder)
	if err != nil {
		return nil, fmt.Errorf("devcontainer.json: %w", err)
	}
	if len(refs) > 0 && dir == "" {
		ids := make([]string, len(refs))
		for i, r := range refs {
			ids[i] = r.id
		}
		pending = append(pending, fmt.Sprintf("features (%s): read only with the file's directory", strings.Join(ids, ", ")))
	} else if len(refs) > 0 {
		// The features' containerEnv comes under the file's own.
		fenv := maps.Clone(s.Env)
		if fenv == nil {
			fenv = map[string]string{}
		}
		steps, err := featureSteps(ctx, refs, dir, fetch, featureUsers{remote: dc.RemoteUser, container: dc.ContainerUser}, fenv)
		if err != nil {
			return nil, fmt.Errorf("devcontainer.json: %w", err)
		}
		s.Setup = append(s.Setup, steps...)
		for k, v := range fenv {
			if _, own := s.Env[k]; !own {
				if s.Env == nil {
					s.Env = map[string]string{}
				}
				s.Env[k] = v
			}
		}
	}
	for _, raw := range dc.ForwardPorts {
		var p int
		if json.Unmarshal(raw, &p) != nil {
			return nil, fmt.Errorf("devcontainer.json: forwardPorts: %s: tine reads port numbers only", raw)
		}
		s.Expose = append(s.Expose, p)
	}
	for _, c := range []struct {
		field string
		raw   json.RawMessage
	}{{"onCreateCommand", dc.OnCreateCommand}, {"updateContentCommand", dc.UpdateContentCommand}, {"postCreateCommand", dc.PostCreateCommand}} {
		steps, err := commandSteps(c.field, c.raw)
		if err != nil {
			return nil, err
		}
		s.Setup = append(s.Setup, steps...)
	}
	steps, err := commandSteps("postStartCommand", dc.PostStartCommand)
	if err != nil {
		return nil, err
	}
	s.Services = steps
	if dc.Name != "" && nameRE().MatchString(dc.Name) {
		s.Name = dc.Name
	}
	if err := s.Check(); err != nil {
		return nil, fmt.Errorf("devcontainer.json: %w", err)
	}
	s.Pending = append(s.Pending, pending...)
	return s, nil
}

func isSet(raw json.RawMessage) bool {
	t := strings.TrimSpace(string(raw))
	return t != "" && t != "null"
}

// commandSteps reads a lifecycle command: a string (a shell line), an
// array (argv), or an object of named commands (which the format runs in
// parallel; tine runs them in name order).
func commandSteps(field string, raw json.RawMessage) ([]Step, error) {
	if !isSet(raw) {
		return nil, nil
	}
	var line string
	if json.Unmarshal(raw, &line) == nil {
		return []Step{{Name: field, Run: line}}, nil
	}
	var argv []string
	if json.Unmarshal(raw, &argv) == nil {
		return []Step{{Name: field, Run: shellJoin(argv)}}, nil
	}
	var named map[string]json.RawMessage
	if json.Unmarshal(raw, &named) == nil {
		keys := make([]string, 0, len(named))
		for k := range named {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var out []Step
		for _, k := range keys {
			if _, isObj := asObject(named[k]); isObj {
				return nil, fmt.Errorf("devcontainer.json: %s.%s: want a string or an array", field, k)
			}
			sub, err := commandSteps(field+"."+k, named[k])
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		}
		return out, nil
	}
	return nil, fmt.Errorf("devcontainer.json: %s: want a string, an array or an object of commands", field)
}

func asObject(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	return m, json.Unmarshal(raw, &m) == nil
}

// shellJoin quotes argv for sh -c.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// StripJSONC turns JSON with comments (// and /* */) and trailing commas
// into JSON. Strings are kept as they are; an unterminated comment or
// string ends the input.
func StripJSONC(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '"':
			j := i + 1
			for j < len(b) && b[j] != '"' {
				if b[j] == '\\' {
					j++
				}
				j++
			}
			j = min(j, len(b)-1)
			out = append(out, b[i:j+1]...)
			i = j
		case c == '/' && i+1 < len(b) && b[i+1] == '/':
			for i < len(b) && b[i] != '\n' {
				i++
			}
			if i < len(b) {
				out = append(out, '\n')
			}
		case c == '/' && i+1 < len(b) && b[i+1] == '*':
			i += 2
			for i+1 < len(b) && !(b[i] == '*' && b[i+1] == '/') {
				i++
			}
			i++
			out = append(out, ' ')
		case c == ']' || c == '}':
			// Drop a comma that only whitespace separates from c.
			k := len(out) - 1
			for k >= 0 && (out[k] == ' ' || out[k] == '\t' || out[k] == '\n' || out[k] == '\r') {
				k--
			}
			if k >= 0 && out[k] == ',' {
				out = append(out[:k], out[k+1:]...)
			}
			out = append(out, c)
		default:
			out = append(out, c)
		}
	}
	return out
}
