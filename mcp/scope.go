package mcp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"tine/api"
	"tine/api/client"
	"tine/sandbox"
)

// maxForkDepth bounds the walk up a sandbox's forked_from chain.
const maxForkDepth = 256

// scope is what one MCP session may act on: the sandboxes it created and
// every sandbox forked from them, or every sandbox when all is set.
type scope struct {
	c   *client.Client
	all bool

	mu    sync.Mutex
	owned map[string]bool
}

func newScope(c *client.Client, all bool) *scope {
	return &scope{c: c, all: all, owned: map[string]bool{}}
}

// add records sandboxes this session made.
func (s *scope) add(names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		s.owned[n] = true
	}
}

// drop forgets a removed sandbox.
func (s *scope) drop(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.owned, name)
}

func (s *scope) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.owned[name]
}

// errOutside is the answer for a sandbox the session may not see; it reads
// like a missing sandbox so that a session cannot probe for names.
func errOutside(name string) error {
	return fmt.Errorf("sandbox %q not found among this session's sandboxes; list them with the list tool, or create one with the create tool", name)
}

// check returns nil when the session may act on name: it made it, or name
// descends from a sandbox it made through forks.
func (s *scope) check(ctx context.Context, name string) error {
	if s.all || s.has(name) {
		return nil
	}
	cur := name
	for range maxForkDepth {
		sb, err := s.c.Get(ctx, cur)
		if errors.Is(err, sandbox.ErrNotFound) {
			return errOutside(name)
		}
		if err != nil {
			return err
		}
		if sb.ForkedFrom == "" {
			return errOutside(name)
		}
		cur = sb.ForkedFrom
		if s.has(cur) {
			return nil
		}
	}
	return errOutside(name)
}

// visible filters a listing down to the session's sandboxes: those it made
// and their descendants.
func (s *scope) visible(all []api.Sandbox) []api.Sandbox {
	if s.all {
		return all
	}
	parent := make(map[string]string, len(all))
	for _, sb := range all {
		parent[sb.Name] = sb.ForkedFrom
	}
	var out []api.Sandbox
	for _, sb := range all {
		cur := sb.Name
		for range maxForkDepth {
			if s.has(cur) {
				out = append(out, sb)
				break
			}
			p, ok := parent[cur]
			if !ok || p == "" {
				break
			}
			cur = p
		}
	}
	return out
}
