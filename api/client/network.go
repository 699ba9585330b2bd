package client

import (
	"context"
	"net/url"
	"strconv"

	"tine/api"
	"tine/sandbox"
)

// Network returns a sandbox's network policy and, when it runs attached,
// its addresses and counts of denied destinations.
func (c *Client) Network(ctx context.Context, name string) (*api.Network, error) {
	var out api.Network
	return &out, c.call(ctx, "GET", sandboxPath(name, "/network"), nil, &out)
}

// SetNetwork changes a sandbox's network policy (at once when it runs)
// and returns it as it is now.
func (c *Client) SetNetwork(ctx context.Context, name string, req api.NetworkRequest) (*api.Network, error) {
	var out api.Network
	return &out, c.call(ctx, "PUT", sandboxPath(name, "/network"), req, &out)
}

// Exposures lists a sandbox's forwarded ports and whether auto-expose is
// on.
func (c *Client) Exposures(ctx context.Context, name string) (*api.Exposures, error) {
	var out api.Exposures
	return &out, c.call(ctx, "GET", sandboxPath(name, "/exposures"), nil, &out)
}

// Expose forwards a host port to a port of the running sandbox.
func (c *Client) Expose(ctx context.Context, name string, req api.ExposeRequest) (*sandbox.Exposure, error) {
	var out sandbox.Exposure
	return &out, c.call(ctx, "POST", sandboxPath(name, "/exposures"), req, &out)
}

// Unexpose closes the exposure of a sandbox's port.
func (c *Client) Unexpose(ctx context.Context, name string, port int) error {
	return c.call(ctx, "DELETE", sandboxPath(name, "/exposures/", strconv.Itoa(port)), nil, nil)
}

// SetAutoExpose turns auto-expose on or off.
func (c *Client) SetAutoExpose(ctx context.Context, name string, on bool) error {
	return c.call(ctx, "PUT", sandboxPath(name, "/exposures/auto"), api.AutoExposeRequest{Enabled: on}, nil)
}

// Secrets lists the daemon's secrets (names and sizes, never values).
func (c *Client) Secrets(ctx context.Context) ([]sandbox.SecretInfo, error) {
	var out []sandbox.SecretInfo
	return out, c.call(ctx, "GET", "/secrets", nil, &out)
}

// SetSecret stores a secret in the daemon.
func (c *Client) SetSecret(ctx context.Context, name string, value []byte) error {
	return c.call(ctx, "PUT", "/secrets/"+url.PathEscape(name), api.SecretRequest{Value: string(value)}, nil)
}

// RemoveSecret deletes a secret from the daemon.
func (c *Client) RemoveSecret(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/secrets/"+url.PathEscape(name), nil, nil)
}
