package client

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"time"

	"tine/api"
	"tine/sandbox"
)

// Send sends a message from the host to sandbox name; body is any JSON
// value but null, at most 64 KiB.
func (c *Client) Send(ctx context.Context, name string, body json.RawMessage) (*api.MessageSent, error) {
	var out api.MessageSent
	if err := c.call(ctx, "POST", sandboxPath(name, "/messages"), api.MessageRequest{Body: body}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Messages reads sandbox name's inbox: the messages after o.After,
// waiting up to o.Wait for one when there is none, and taking them out
// of the inbox when o.Take.
func (c *Client) Messages(ctx context.Context, name string, o sandbox.ReadOptions) ([]api.Message, error) {
	q := url.Values{}
	if o.Wait > 0 {
		q.Set("wait", o.Wait.Round(time.Millisecond).String())
	}
	if o.Take {
		q.Set("take", "true")
	}
	if o.After > 0 {
		q.Set("after", strconv.FormatUint(o.After, 10))
	}
	p := sandboxPath(name, "/messages")
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var out []api.Message
	return out, c.call(ctx, "GET", p, nil, &out)
}
