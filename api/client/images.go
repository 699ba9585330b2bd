package client

import (
	"context"
	"net/url"
	"strings"

	"tine/api"
)

// imagePath is the path of one image; a reference keeps its slashes.
func imagePath(ref string) string {
	parts := strings.Split(ref, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/images/" + strings.Join(parts, "/")
}

// Images lists the images in the daemon's store.
func (c *Client) Images(ctx context.Context) ([]api.Image, error) {
	var out []api.Image
	return out, c.call(ctx, "GET", "/images", nil, &out)
}

// Image returns one image by name or digest.
func (c *Client) Image(ctx context.Context, ref string) (*api.Image, error) {
	var im api.Image
	if err := c.call(ctx, "GET", imagePath(ref), nil, &im); err != nil {
		return nil, err
	}
	return &im, nil
}

// PullImage pulls an image from its registry into the daemon's store.
func (c *Client) PullImage(ctx context.Context, req api.PullRequest) (*api.Image, error) {
	var im api.Image
	if err := c.call(ctx, "POST", "/images/pull", req, &im); err != nil {
		return nil, err
	}
	return &im, nil
}

// ImportImage unpacks a docker save tarball or an OCI layout directory on
// the daemon's host into its store.
func (c *Client) ImportImage(ctx context.Context, req api.ImportRequest) (*api.Image, error) {
	var im api.Image
	if err := c.call(ctx, "POST", "/images/import", req, &im); err != nil {
		return nil, err
	}
	return &im, nil
}

// RemoveImage removes an image's name, and the image with its last one.
func (c *Client) RemoveImage(ctx context.Context, ref string) (*api.RemoveImageResponse, error) {
	var out api.RemoveImageResponse
	if err := c.call(ctx, "DELETE", imagePath(ref), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
