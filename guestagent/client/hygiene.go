package client

import (
	"context"
	"fmt"

	"tine/guestagent/proto"
)

// Hygiene sends a VM clone its fork-hygiene step (docs/fork-hygiene.md)
// and waits until the agent applied it.
func (c *Client) Hygiene(ctx context.Context, req proto.HygieneRequest) error {
	s, err := c.open(ctx, proto.KindHygiene, req)
	if err != nil {
		return err
	}
	defer c.forget(s)
	f, err := c.recv(ctx, s)
	if err != nil {
		return fmt.Errorf("hygiene: %w", err)
	}
	if f.Kind != proto.KindEnd {
		return fmt.Errorf("hygiene: the agent answered a %v frame, want end", f.Kind)
	}
	return nil
}
