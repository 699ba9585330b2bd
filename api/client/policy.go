package client

import (
	"context"
	"io"
	"net/url"
	"strconv"

	"tine/api"
	"tine/execpolicy"
	"tine/sandbox"
)

// Limits returns a sandbox's limits, usage and frozen state.
func (c *Client) Limits(ctx context.Context, name string) (*api.LimitsResponse, error) {
	var out api.LimitsResponse
	return &out, c.call(ctx, "GET", sandboxPath(name, "/limits"), nil, &out)
}

// UpdateLimits replaces a sandbox's limits.
func (c *Client) UpdateLimits(ctx context.Context, name string, l sandbox.Limits) (*api.LimitsResponse, error) {
	var out api.LimitsResponse
	return &out, c.call(ctx, "PUT", sandboxPath(name, "/limits"), l, &out)
}

// Freeze freezes a running sandbox; Thaw resumes it.
func (c *Client) Freeze(ctx context.Context, name string) error {
	return c.call(ctx, "POST", sandboxPath(name, "/freeze"), nil, nil)
}

// Thaw resumes a frozen sandbox.
func (c *Client) Thaw(ctx context.Context, name string) error {
	return c.call(ctx, "POST", sandboxPath(name, "/thaw"), nil, nil)
}

// auditPath is the audit route of a sandbox, or the daemon's for "".
func auditPath(name, rest string) string {
	if name == "" {
		return "/audit" + rest
	}
	return sandboxPath(name, "/audit"+rest)
}

// Audit streams a sandbox's audit log (the daemon's when name is ""),
// one JSON record a line, from record from; with follow the stream stays
// open for new records until ctx ends.
func (c *Client) Audit(ctx context.Context, name string, from int64, follow bool) (io.ReadCloser, error) {
	q := url.Values{}
	if from > 0 {
		q.Set("from", strconv.FormatInt(from, 10))
	}
	if follow {
		q.Set("follow", "1")
	}
	p := auditPath(name, "")
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	resp, err := c.do(ctx, "GET", p, nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// VerifyAudit checks a sandbox's audit log (the daemon's when name is
// ""), against head ("SEQ HASH") when given.
func (c *Client) VerifyAudit(ctx context.Context, name, head string) (*api.VerifyResponse, error) {
	p := auditPath(name, "/verify")
	if head != "" {
		p += "?" + url.Values{"head": {head}}.Encode()
	}
	var out api.VerifyResponse
	return &out, c.call(ctx, "GET", p, nil, &out)
}

// ExecPolicy returns a sandbox's exec policy; SetExecPolicy replaces it.
func (c *Client) ExecPolicy(ctx context.Context, name string) (*execpolicy.Policy, error) {
	var out execpolicy.Policy
	return &out, c.call(ctx, "GET", sandboxPath(name, "/policy/exec"), nil, &out)
}

// SetExecPolicy replaces a sandbox's exec policy.
func (c *Client) SetExecPolicy(ctx context.Context, name string, p *execpolicy.Policy) (*execpolicy.Policy, error) {
	var out execpolicy.Policy
	return &out, c.call(ctx, "PUT", sandboxPath(name, "/policy/exec"), p, &out)
}

// Usage returns the limits and use of every sandbox, read without asking
// their agents.
func (c *Client) Usage(ctx context.Context) (*api.UsageResponse, error) {
	var out api.UsageResponse
	return &out, c.call(ctx, "GET", "/usage", nil, &out)
}
