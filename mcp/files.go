package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"tine/api"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// ReadFileIn are read_file's arguments.
type ReadFileIn struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path    string `json:"path" jsonschema:"the file: absolute, or relative to the project directory"`
}

// FileOut is one file's contents: text when it is UTF-8, else base64.
type FileOut struct {
	Path   string `json:"path" jsonschema:"the file's absolute path in the sandbox"`
	Size   int    `json:"size"`
	Text   string `json:"text,omitempty" jsonschema:"the contents, when they are UTF-8"`
	Base64 string `json:"base64,omitempty" jsonschema:"the contents as base64, when they are not UTF-8"`
}

// WriteFileIn are write_file's arguments.
type WriteFileIn struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path    string `json:"path" jsonschema:"the file: absolute, or relative to the project directory; its directory must exist"`
	Text    string `json:"text,omitempty" jsonschema:"the new contents as text"`
	Base64  string `json:"base64,omitempty" jsonschema:"the new contents as base64, in place of text"`
	Mode    string `json:"mode,omitempty" jsonschema:"octal permission bits such as 0755 (default 0644)"`
}

// WriteFileOut says what write_file wrote.
type WriteFileOut struct {
	Path  string `json:"path" jsonschema:"the file's absolute path in the sandbox"`
	Bytes int    `json:"bytes"`
}

func (t *tools) registerFiles(s *sdk.Server) {
	sdk.AddTool(s, &sdk.Tool{Name: "read_file", Description: "Read one file of a sandbox (at most 4 MiB): text when it is UTF-8, base64 otherwise.",
		Annotations: readOnly}, t.readFile)
	sdk.AddTool(s, &sdk.Tool{Name: "write_file", Description: "Write one file of a sandbox, whole: it is replaced at once, never seen half written. Give text, or base64 for bytes.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes}}, t.writeFile)
}

// filePath is p made absolute in sandbox sb: a relative path is in its
// project directory.
func (t *tools) filePath(ctx context.Context, sb, p string) (string, error) {
	if p == "" {
		return "", errors.New("give the file's path")
	}
	if path.IsAbs(p) {
		return path.Clean(p), nil
	}
	st, err := t.c.Get(ctx, sb)
	if err != nil {
		return "", err
	}
	return path.Join(st.ProjectPath, p), nil
}

// readSmall reads file p of sandbox sb, refusing one larger than
// maxResourceBytes with the way to read it in parts.
func (t *tools) readSmall(ctx context.Context, sb, p string) ([]byte, error) {
	buf := &limitedBuffer{limit: maxResourceBytes}
	if err := t.c.GetFile(ctx, sb, p, buf); err != nil {
		if errors.Is(err, errTooLarge) {
			return nil, fmt.Errorf("%s in sandbox %s is larger than %d bytes; read it in parts with the exec tool (head, tail, sed -n)", p, sb, maxResourceBytes)
		}
		return nil, err
	}
	return buf.Bytes(), nil
}

func (t *tools) readFile(ctx context.Context, _ *sdk.CallToolRequest, in ReadFileIn) (*sdk.CallToolResult, FileOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, FileOut{}, err
	}
	p, err := t.filePath(ctx, in.Sandbox, in.Path)
	if err != nil {
		return nil, FileOut{}, err
	}
	b, err := t.readSmall(ctx, in.Sandbox, p)
	if err != nil {
		return nil, FileOut{}, err
	}
	out := FileOut{Path: p, Size: len(b)}
	if utf8.Valid(b) {
		out.Text = string(b)
	} else {
		out.Base64 = base64.StdEncoding.EncodeToString(b)
	}
	return nil, out, nil
}

func (t *tools) writeFile(ctx context.Context, _ *sdk.CallToolRequest, in WriteFileIn) (*sdk.CallToolResult, WriteFileOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, WriteFileOut{}, err
	}
	data := []byte(in.Text)
	if in.Base64 != "" {
		if in.Text != "" {
			return nil, WriteFileOut{}, errors.New("give text or base64, not both")
		}
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Base64); err != nil {
			return nil, WriteFileOut{}, fmt.Errorf("base64: %v", err)
		}
	}
	if len(data) > maxResourceBytes {
		return nil, WriteFileOut{}, fmt.Errorf("%d bytes is more than write_file takes (%d); write larger files with tine cp", len(data), maxResourceBytes)
	}
	mode := uint32(0o644)
	if in.Mode != "" {
		var err error
		if mode, err = api.ParseMode(in.Mode); err != nil {
			return nil, WriteFileOut{}, fmt.Errorf("mode %q: %v", in.Mode, err)
		}
	}
	p, err := t.filePath(ctx, in.Sandbox, in.Path)
	if err != nil {
		return nil, WriteFileOut{}, err
	}
	if err := t.c.PutFile(ctx, in.Sandbox, p, mode, bytes.NewReader(data)); err != nil {
		return nil, WriteFileOut{}, err
	}
	return nil, WriteFileOut{Path: p, Bytes: len(data)}, nil
}
