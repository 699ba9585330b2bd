package client

import (
	"context"
	"net/url"

	"tine/api"
)

// Approvals lists what code inside sandboxes asked a person for: all, or
// sandbox sb's.
func (c *Client) Approvals(ctx context.Context, sb string) ([]api.Approval, error) {
	p := "/approvals"
	if sb != "" {
		p += "?sandbox=" + url.QueryEscape(sb)
	}
	var out []api.Approval
	return out, c.call(ctx, "GET", p, nil, &out)
}

// Answer approves or denies the pending request id, with msg for the
// sandbox that asked.
func (c *Client) Answer(ctx context.Context, id string, approve bool, msg string) (*api.Approval, error) {
	verb := "/deny"
	if approve {
		verb = "/approve"
	}
	var out api.Approval
	return &out, c.call(ctx, "POST", "/approvals/"+url.PathEscape(id)+verb, api.AnswerRequest{Message: msg}, &out)
}
