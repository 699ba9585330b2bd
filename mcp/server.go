package mcp

import (
	"crypto/subtle"
	"net/http"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"tine/api/client"
)

// Options configures a server.
type Options struct {
	// Client talks to the daemon.
	Client *client.Client
	// All lets every session see and act on every sandbox of the daemon,
	// not only those it created and their forks.
	All bool
	// Version is reported to clients as the server's version.
	Version string
}

// instructions tell a client's model how the tools fit together.
const instructions = `tine gives you sandboxes: isolated copies of a project directory (and the host OS under it) that you can change freely.
Typical flow: create {from: "/abs/project"} -> exec commands in it -> snapshot before a risky step, rollback if it goes wrong -> fork N ways to try N ideas -> diff to see what changed -> promote {dry_run:true} to see the plan, then promote to apply the winner's changes to the host directory -> rm what you no longer need.
This session sees only the sandboxes it created and their forks.`

// New returns an MCP server for one session (stdio, or one HTTP session):
// its scope starts empty and grows with the sandboxes it creates.
func New(o Options) *sdk.Server {
	version := o.Version
	if version == "" {
		version = "dev"
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "tine", Title: "tine sandboxes", Version: version},
		&sdk.ServerOptions{Instructions: instructions})
	t := &tools{c: o.Client, sc: newScope(o.Client, o.All)}
	t.register(s)
	t.registerResources(s)
	t.registerPolicy(s)
	return s
}

// Handler serves MCP over streamable HTTP: each session gets its own server
// and scope. When token is not empty, every request must carry
// "Authorization: Bearer TOKEN".
func Handler(o Options, token string) http.Handler {
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return New(o) }, nil)
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tine mcp"`)
			http.Error(w, "tine mcp: missing or wrong bearer token (give the token printed by tine mcp --http, or set with TINE_MCP_TOKEN)", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
