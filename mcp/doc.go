// Package mcp serves tine over the Model Context Protocol: the tools an
// agent harness calls to create sandboxes, run commands in them (output
// streamed as progress notifications), fork, snapshot, roll back, diff and
// promote, and the resources through which it reads a sandbox's files and
// diff. It is a client of the daemon's API (package api/client) and holds
// no state of its own beyond each session's scope: the sandboxes that
// session created, whose forks it also sees. docs/mcp.md describes it.
package mcp
