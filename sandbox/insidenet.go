package sandbox

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// The API inside a sandbox reaches it two ways: the Unix socket at
// InsideSocket (every mode), and, in network modes allow and open, HTTP
// at InsideName on its gateway's address, port APIPort. The listener is
// bound to the sandbox's own veth and serves its address only, so the
// connection, never the request, says which sandbox asks.
const (
	// InsideSocket is where a sandbox finds its API socket.
	InsideSocket = "/run/tine/api.sock"
	// InsideName is the name the sandbox's resolver gives its gateway's
	// address, for its API over HTTP.
	InsideName = "tine.internal"
	// APIPort is the port of the API on the gateway's address.
	APIPort = 7380
)

// InsideHTTP is an InsideAPI that also serves a sandbox's API on a
// listener; package api's Inside is one.
type InsideHTTP interface {
	// ServeListener serves sandbox name's API on ln until ln is closed.
	ServeListener(name string, ln net.Listener) error
}

// serveInsideHTTP serves the sandbox's API on its gateway's address when
// the manager's InsideAPI can, and keeps the listener in sn.api.
func (m *Manager) serveInsideHTTP(ctx context.Context, name string, sn *sandboxNet) error {
	m.mu.Lock()
	a, _ := m.inside.(InsideHTTP)
	m.mu.Unlock()
	if a == nil {
		return nil
	}
	ln, err := sn.link.Listen(ctx, APIPort)
	if err != nil {
		return fmt.Errorf("sandbox %q: its API on %s:%d: %w", name, sn.link.Gateway, APIPort, err)
	}
	sn.api = ln
	go a.ServeListener(name, ln)
	return nil
}

// apiURL is the sandbox's API over HTTP, or "" when it has none.
func (m *Manager) apiURL(name string) string {
	m.net.mu.Lock()
	defer m.net.mu.Unlock()
	if sn := m.net.live[name]; sn != nil && sn.api != nil {
		return "http://" + InsideName + ":" + strconv.Itoa(APIPort)
	}
	return ""
}

// commandEnv adds TINE_API_SOCKET (when the runtime bound the API's
// socket) and TINE_API_URL (when the API is served over HTTP too) to a
// command's environment, unless the command sets them itself (the guest
// agent adds PATH, HOME and TERM where missing).
func (m *Manager) commandEnv(name string, l *live, env []string) []string {
	var add []string
	if l.apiSocket {
		add = append(add, "TINE_API_SOCKET="+InsideSocket)
	}
	if u := m.apiURL(name); u != "" {
		add = append(add, "TINE_API_URL="+u)
	}
	if len(add) == 0 {
		return env
	}
	out := make([]string, 0, len(env)+len(add))
	out = append(out, env...)
	for _, kv := range add {
		k, _, _ := strings.Cut(kv, "=")
		if !hasVar(env, k) {
			out = append(out, kv)
		}
	}
	return out
}

func hasVar(env []string, k string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			return true
		}
	}
	return false
}
