package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxResourceBytes is the largest file the files resource returns.
const maxResourceBytes = 4 << 20

// uriPrefix begins every resource of a sandbox.
const uriPrefix = "tine://sandboxes/"

func (t *tools) registerResources(s *sdk.Server) {
	s.AddResourceTemplate(&sdk.ResourceTemplate{
		Name: "sandbox-file", Title: "A file in a sandbox",
		URITemplate: uriPrefix + "{sandbox}/files{+path}",
		Description: "The contents of one file inside a sandbox, by its absolute path (at most 4 MiB): tine://sandboxes/SB/files/abs/path.",
	}, t.readResource)
	s.AddResourceTemplate(&sdk.ResourceTemplate{
		Name: "sandbox-diff", Title: "A sandbox's changes",
		URITemplate: uriPrefix + "{sandbox}/diff",
		Description: "The sandbox's project changes since its origin, as JSON.",
		MIMEType:    "application/json",
	}, t.readResource)
	s.AddResourceTemplate(&sdk.ResourceTemplate{
		Name: "sandbox-audit", Title: "A sandbox's audit log",
		URITemplate: uriPrefix + "{sandbox}/audit",
		Description: "The sandbox's audit log: one JSON record a line, hash-chained, oldest first (its last 4 MiB when longer).",
		MIMEType:    "application/x-ndjson",
	}, t.readResource)
}

// limitedBuffer fails a write past its limit.
type limitedBuffer struct {
	bytes.Buffer
	limit int
}

var errTooLarge = errors.New("too large")

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.limit {
		return 0, errTooLarge
	}
	return b.Buffer.Write(p)
}

// parseURI splits tine://sandboxes/SB/files/PATH or tine://sandboxes/SB/diff.
func parseURI(uri string) (sb, kind, path string, err error) {
	rest, ok := strings.CutPrefix(uri, uriPrefix)
	if !ok {
		return "", "", "", fmt.Errorf("resource %q: want %sSANDBOX/files/PATH, %sSANDBOX/diff or %sSANDBOX/audit", uri, uriPrefix, uriPrefix, uriPrefix)
	}
	sb, rest, _ = strings.Cut(rest, "/")
	if sb, err = url.PathUnescape(sb); err != nil || sb == "" {
		return "", "", "", fmt.Errorf("resource %q: bad sandbox name", uri)
	}
	switch {
	case rest == "diff", rest == "audit":
		return sb, rest, "", nil
	case strings.HasPrefix(rest, "files/"):
		p, err := url.PathUnescape(strings.TrimPrefix(rest, "files"))
		if err != nil {
			return "", "", "", fmt.Errorf("resource %q: bad path: %v", uri, err)
		}
		return sb, "files", p, nil
	}
	return "", "", "", fmt.Errorf("resource %q: want %sSANDBOX/files/PATH, %sSANDBOX/diff or %sSANDBOX/audit", uri, uriPrefix, uriPrefix, uriPrefix)
}

func (t *tools) readResource(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
	uri := req.Params.URI
	sb, kind, path, err := parseURI(uri)
	if err != nil {
		return nil, err
	}
	if err := t.sc.check(ctx, sb); err != nil {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	switch kind {
	case "diff":
		cs, err := t.c.Diff(ctx, sb, "")
		if err != nil {
			return nil, err
		}
		all, _ := changes(cs, len(cs))
		b, err := json.MarshalIndent(all, "", "  ")
		if err != nil {
			return nil, err
		}
		return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(b)}}}, nil
	case "audit":
		text, err := t.auditTail(ctx, sb)
		if err != nil {
			return nil, err
		}
		return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: uri, MIMEType: "application/x-ndjson", Text: text}}}, nil
	default:
		b, err := t.readSmall(ctx, sb, path)
		if err != nil {
			return nil, err
		}
		rc := &sdk.ResourceContents{URI: uri}
		if utf8.Valid(b) {
			rc.MIMEType, rc.Text = "text/plain", string(b)
		} else {
			rc.MIMEType, rc.Blob = "application/octet-stream", b
		}
		return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{rc}}, nil
	}
}

// auditTail reads a sandbox's audit log, keeping its last
// maxResourceBytes in whole lines.
func (t *tools) auditTail(ctx context.Context, sb string) (string, error) {
	rc, err := t.c.Audit(ctx, sb, 0, false)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	var keep []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := rc.Read(buf)
		keep = append(keep, buf[:n]...)
		if len(keep) > 2*maxResourceBytes {
			keep = append([]byte(nil), keep[len(keep)-maxResourceBytes:]...)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("audit log of %s: %w", sb, err)
		}
	}
	if len(keep) > maxResourceBytes {
		keep = keep[len(keep)-maxResourceBytes:]
		if i := bytes.IndexByte(keep, '\n'); i >= 0 {
			keep = keep[i+1:]
		}
	}
	return strings.ToValidUTF8(string(keep), "\uFFFD"), nil
}
