package mcp

import (
	"context"
	"fmt"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"tine/api"
)

// The tools over a sandbox's policy: exposed ports, freezing, network
// policy and limits.

// ExposeIn are the expose tool's arguments.
type ExposeIn struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's name"`
	Port     int    `json:"port" jsonschema:"the port inside the sandbox, 1-65535"`
	HostPort int    `json:"host_port,omitempty" jsonschema:"the host's port (default: the same when free, otherwise any)"`
}

// ExposeOut is a port forwarded to the host.
type ExposeOut struct {
	Port        int    `json:"port"`
	HostAddress string `json:"host_address"`
	HostPort    int    `json:"host_port"`
	URL         string `json:"url" jsonschema:"an address a person can open"`
}

// FreezeOut is a sandbox's frozen state after freeze or thaw.
type FreezeOut struct {
	Sandbox string `json:"sandbox"`
	Frozen  bool   `json:"frozen"`
	// Reason says why it is frozen.
	Reason string `json:"reason,omitempty"`
}

// NetworkOut is a sandbox's network policy.
type NetworkOut struct {
	Mode  string   `json:"mode" jsonschema:"none, allow (only the allow-list) or open"`
	Allow []string `json:"allow"`
	// Denied counts refused destinations since the last call.
	Denied map[string]int `json:"denied,omitempty" jsonschema:"destinations refused since the last call, with counts"`
}

// SetNetworkIn are the set_network tool's arguments.
type SetNetworkIn struct {
	Sandbox string   `json:"sandbox" jsonschema:"the sandbox's name"`
	Mode    string   `json:"mode,omitempty" jsonschema:"none, allow or open (default: the current mode, or allow when adding)"`
	Allow   []string `json:"allow,omitempty" jsonschema:"the whole allow-list: NAME, *.NAME, IP or CIDR, each with an optional :PORT or :LO-HI"`
	Add     []string `json:"add,omitempty" jsonschema:"entries added to the current allow-list"`
	Remove  []string `json:"remove,omitempty" jsonschema:"entries removed from the current allow-list"`
}

// LimitsOut are a sandbox's limits, usage and frozen state.
type LimitsOut struct {
	Pids            int64   `json:"pids,omitempty" jsonschema:"the most processes and threads at once"`
	ProjectBytes    int64   `json:"project_bytes,omitempty" jsonschema:"the most bytes written into the project"`
	MemoryBytes     int64   `json:"memory_bytes,omitempty" jsonschema:"the most memory, tmpfs files included"`
	CPUs            float64 `json:"cpus,omitempty" jsonschema:"CPU time per second, in CPUs"`
	LifetimeSeconds float64 `json:"lifetime_seconds,omitempty" jsonschema:"removed this long after creation"`
	// MemoryUsed and PidsUsed are the usage now (absent when stopped).
	MemoryUsed uint64 `json:"memory_used,omitempty"`
	PidsUsed   uint64 `json:"pids_used,omitempty"`
	Frozen     string `json:"frozen,omitempty" jsonschema:"why the sandbox is frozen; empty when it is not"`
}

// UpdateLimitsIn are the update_limits tool's arguments: the fields given
// change, the others keep their value.
type UpdateLimitsIn struct {
	Sandbox      string   `json:"sandbox" jsonschema:"the sandbox's name"`
	Pids         *int64   `json:"pids,omitempty" jsonschema:"the most processes and threads at once (0: no limit)"`
	ProjectBytes *int64   `json:"project_bytes,omitempty" jsonschema:"the most bytes written into the project (0: no limit)"`
	MemoryBytes  *int64   `json:"memory_bytes,omitempty" jsonschema:"the most memory, tmpfs files included (0: no limit)"`
	CPUs         *float64 `json:"cpus,omitempty" jsonschema:"CPU time per second, in CPUs (0: no limit)"`
}

func (t *tools) registerPolicy(s *sdk.Server) {
	sdk.AddTool(s, &sdk.Tool{Name: "expose", Description: "Forward a port of a sandbox to the host, and get its URL.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no}}, t.expose)
	sdk.AddTool(s, &sdk.Tool{Name: "freeze", Description: "Freeze every process of a sandbox; its files and memory stay as they are until thaw.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no}}, t.freeze)
	sdk.AddTool(s, &sdk.Tool{Name: "thaw", Description: "Let a frozen sandbox's processes run again.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no}}, t.thaw)
	sdk.AddTool(s, &sdk.Tool{Name: "network", Description: "A sandbox's network policy and the destinations it was refused.", Annotations: readOnly}, t.network)
	sdk.AddTool(s, &sdk.Tool{Name: "set_network", Description: "Change a sandbox's network policy: a whole allow-list, or entries added or removed.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no}}, t.setNetwork)
	sdk.AddTool(s, &sdk.Tool{Name: "limits", Description: "A sandbox's limits, usage and frozen state.", Annotations: readOnly}, t.limits)
	sdk.AddTool(s, &sdk.Tool{Name: "update_limits", Description: "Change a running sandbox's limits at once; fields not given keep their value.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no}}, t.updateLimits)
}

func (t *tools) expose(ctx context.Context, _ *sdk.CallToolRequest, in ExposeIn) (*sdk.CallToolResult, ExposeOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, ExposeOut{}, err
	}
	ex, err := t.c.Expose(ctx, in.Sandbox, api.ExposeRequest{Port: in.Port, HostPort: in.HostPort})
	if err != nil {
		return nil, ExposeOut{}, err
	}
	return nil, ExposeOut{Port: ex.Port, HostAddress: ex.HostAddress, HostPort: ex.HostPort, URL: ex.URL}, nil
}

func (t *tools) frozen(ctx context.Context, name string) (FreezeOut, error) {
	l, err := t.c.Limits(ctx, name)
	if err != nil {
		return FreezeOut{}, err
	}
	return FreezeOut{Sandbox: name, Frozen: l.Frozen != "", Reason: l.Frozen}, nil
}

func (t *tools) freeze(ctx context.Context, _ *sdk.CallToolRequest, in NameIn) (*sdk.CallToolResult, FreezeOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, FreezeOut{}, err
	}
	if err := t.c.Freeze(ctx, in.Sandbox); err != nil {
		return nil, FreezeOut{}, err
	}
	out, err := t.frozen(ctx, in.Sandbox)
	return nil, out, err
}

func (t *tools) thaw(ctx context.Context, _ *sdk.CallToolRequest, in NameIn) (*sdk.CallToolResult, FreezeOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, FreezeOut{}, err
	}
	if err := t.c.Thaw(ctx, in.Sandbox); err != nil {
		return nil, FreezeOut{}, err
	}
	out, err := t.frozen(ctx, in.Sandbox)
	return nil, out, err
}

func networkOut(n *api.Network) NetworkOut {
	out := NetworkOut{Mode: "none", Allow: []string{}, Denied: n.Denied}
	if n.Policy != nil {
		out.Mode = string(n.Policy.GetMode())
		out.Allow = append(out.Allow, n.Policy.Allow...)
	}
	return out
}

func (t *tools) network(ctx context.Context, _ *sdk.CallToolRequest, in NameIn) (*sdk.CallToolResult, NetworkOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, NetworkOut{}, err
	}
	n, err := t.c.Network(ctx, in.Sandbox)
	if err != nil {
		return nil, NetworkOut{}, err
	}
	return nil, networkOut(n), nil
}

func (t *tools) setNetwork(ctx context.Context, _ *sdk.CallToolRequest, in SetNetworkIn) (*sdk.CallToolResult, NetworkOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, NetworkOut{}, err
	}
	n, err := t.c.SetNetwork(ctx, in.Sandbox, api.NetworkRequest{Mode: in.Mode, Allow: in.Allow, Add: in.Add, Remove: in.Remove})
	if err != nil {
		return nil, NetworkOut{}, err
	}
	return nil, networkOut(n), nil
}

func limitsOut(r *api.LimitsResponse) LimitsOut {
	l := r.Limits
	out := LimitsOut{Pids: l.Pids, ProjectBytes: l.ProjectBytes, MemoryBytes: l.MemoryBytes, CPUs: l.CPUs,
		LifetimeSeconds: l.Lifetime.Seconds(), Frozen: r.Frozen}
	if r.Usage != nil {
		out.MemoryUsed, out.PidsUsed = r.Usage.MemoryBytes, r.Usage.Pids
	}
	return out
}

func (t *tools) limits(ctx context.Context, _ *sdk.CallToolRequest, in NameIn) (*sdk.CallToolResult, LimitsOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, LimitsOut{}, err
	}
	r, err := t.c.Limits(ctx, in.Sandbox)
	if err != nil {
		return nil, LimitsOut{}, err
	}
	return nil, limitsOut(r), nil
}

func (t *tools) updateLimits(ctx context.Context, _ *sdk.CallToolRequest, in UpdateLimitsIn) (*sdk.CallToolResult, LimitsOut, error) {
	if err := t.sc.check(ctx, in.Sandbox); err != nil {
		return nil, LimitsOut{}, err
	}
	cur, err := t.c.Limits(ctx, in.Sandbox)
	if err != nil {
		return nil, LimitsOut{}, err
	}
	l := cur.Limits
	set := func(p *int64, v *int64) {
		if v != nil {
			*p = *v
		}
	}
	set(&l.Pids, in.Pids)
	set(&l.ProjectBytes, in.ProjectBytes)
	set(&l.MemoryBytes, in.MemoryBytes)
	if in.CPUs != nil {
		l.CPUs = *in.CPUs
	}
	r, err := t.c.UpdateLimits(ctx, in.Sandbox, l)
	if err != nil {
		return nil, LimitsOut{}, fmt.Errorf("update_limits: %w", err)
	}
	return nil, limitsOut(r), nil
}
