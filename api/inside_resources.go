package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"

	"tine/sandbox"
)

// Resources asked from inside a sandbox (POST /v1/self/resources): the
// policy (InsideOptions) has a grant and a ceiling per resource. A level
// up to the grant is applied at once, to the running sandbox; one past
// the grant and up to the ceiling waits for a person (tine approve), and
// is applied when approved; one past the ceiling is refused. Levels are
// absolute, never increments, and a request never lowers a limit: so
// however many requests a sandbox (or its forks) make, and in whatever
// order they are approved, each limit ends at most at the ceiling.

// ResourcesRequest is the body of POST /v1/self/resources inside a
// sandbox: the levels it asks its limits to be raised to. Only
// memory_bytes, cpus, pids and project_bytes may be asked for; a field
// left 0 stays as it is.
type ResourcesRequest struct {
	Limits sandbox.Limits `json:"limits"`
	// Reason tells the person who answers why.
	Reason string `json:"reason,omitempty"`
}

// ResourcesGranted answers POST /v1/self/resources (200) when the policy
// grants the request at once.
type ResourcesGranted struct {
	// State is "granted".
	State string `json:"state"`
	// Limits are the sandbox's limits now, applied to it.
	Limits sandbox.Limits `json:"limits"`
	// Raised names the limits raised (none when it had those levels).
	Raised []string `json:"raised,omitempty"`
}

// level is one resource a sandbox may ask for, in a Limits: an integer
// field or cpus.
type level struct {
	field string // its JSON name
	flag  string // its name in tine serve's --inside-grant and --inside-max
	i     *int64
	f     *float64
}

// levels returns the resources of l a sandbox may ask for.
func levels(l *sandbox.Limits) [4]level {
	return [4]level{
		{field: "memory_bytes", flag: "memory", i: &l.MemoryBytes},
		{field: "cpus", flag: "cpus", f: &l.CPUs},
		{field: "pids", flag: "pids", i: &l.Pids},
		{field: "project_bytes", flag: "disk", i: &l.ProjectBytes},
	}
}

func (v level) zero() bool {
	if v.f != nil {
		return *v.f == 0
	}
	return *v.i == 0
}

// less says v is below o (of the same field), exactly.
func (v level) less(o level) bool {
	if v.f != nil {
		return *v.f < *o.f
	}
	return *v.i < *o.i
}

func (v level) set(o level) {
	if v.f != nil {
		*v.f = *o.f
	} else {
		*v.i = *o.i
	}
}

func (v level) String() string {
	if v.f != nil {
		return strconv.FormatFloat(*v.f, 'g', -1, 64)
	}
	return strconv.FormatInt(*v.i, 10)
}

// validate refuses what no policy could grant.
func (req *ResourcesRequest) validate() error {
	var only sandbox.Limits
	asked := false
	want, keep := levels(&req.Limits), levels(&only)
	for i, v := range want {
		if v.f != nil && (*v.f < 0 || *v.f > 4096) {
			return badRequest("field \"limits.cpus\": %s: want 0 (leave it) to 4096", v)
		}
		if v.i != nil && *v.i < 0 {
			return badRequest("field \"limits.%s\": %s: want 0 (leave it) or more", v.field, v)
		}
		keep[i].set(v)
		asked = asked || !v.zero()
	}
	if !reflect.DeepEqual(only, req.Limits) {
		return badRequest("field \"limits\": a sandbox may ask only for memory_bytes, cpus, pids and project_bytes; a person changes the others with tine update")
	}
	if !asked {
		return badRequest("field \"limits\" asks for nothing; give memory_bytes, cpus, pids or project_bytes")
	}
	return validReason(req.Reason)
}

// raise is what the policy makes of a request for want by a sandbox whose
// limits are cur.
type raise struct {
	// next is cur with the asked levels over it raised to them.
	next sandbox.Limits
	// raised names those fields.
	raised []string
	// refused, when not "", says why the request is refused: the first
	// field past the ceiling.
	refused string
	// pend says a raised field is past the grant: a person decides.
	pend bool
}

// decideRaise applies the policy (grant, ceiling max) to a request for
// want by a sandbox whose limits are cur. A level at or under the current
// one, or where there is no limit now, is left as it is; a field zero in
// max may not be asked for at all.
func decideRaise(cur, want, grant, max sandbox.Limits) raise {
	r := raise{next: cur}
	next, w, g, m := levels(&r.next), levels(&want), levels(&grant), levels(&max)
	for i, v := range w {
		if v.zero() {
			continue
		}
		if m[i].zero() {
			r.refused = fmt.Sprintf("%s %s: the policy lets no sandbox raise %s (a person starts the daemon with tine serve --inside-max %s=..., or raises it with tine update)", v.field, v, v.field, v.flag)
			return r
		}
		if m[i].less(v) {
			r.refused = fmt.Sprintf("%s %s: above the policy's ceiling of %s (tine serve --inside-max %s=%s)", v.field, v, m[i], v.flag, m[i])
			return r
		}
		if next[i].zero() || !next[i].less(v) {
			continue // it has that much, or no limit
		}
		next[i].set(v)
		r.raised = append(r.raised, v.field)
		if g[i].zero() || g[i].less(v) {
			r.pend = true
		}
	}
	return r
}

// errPend says a raise is past the grant (ChangeLimits leaves the limits).
var errPend = errors.New("past the grant")

// resources answers POST /v1/self/resources: granted and applied at once
// (200), pending for a person (202, an Approval), or refused (403).
func (h *insideHandler) resources(w http.ResponseWriter, r *http.Request) {
	var req ResourcesRequest
	if !decode(w, r, &req) {
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, err)
		return
	}
	m, o := h.in.m, h.in.o
	var d raise
	info, err := m.ChangeLimits(context.WithoutCancel(r.Context()), h.self, func(cur sandbox.Limits) (sandbox.Limits, error) {
		d = decideRaise(cur, req.Limits, o.Grant, o.MaxLimits)
		switch {
		case d.refused != "":
			return cur, &Error{Code: "forbidden", Message: fmt.Sprintf("sandbox %q asks for %s", h.self, d.refused)}
		case d.pend:
			return cur, errPend
		case len(d.raised) == 0:
			return cur, nil
		}
		return d.next, nil
	})
	var e *Error
	switch {
	case errors.As(err, &e) && e.Code == "forbidden":
		m.Audit(h.self, "resources-refused", map[string]any{"asked": req.Limits, "reason": req.Reason, "why": e.Message})
		writeJSON(w, http.StatusForbidden, e)
		return
	case errors.Is(err, errPend):
		want := req.Limits
		a, err := h.in.appr.add(&Approval{Sandbox: h.self, Kind: "resources", Reason: req.Reason, Limits: &want}, 0)
		if err != nil {
			writeError(w, err)
			return
		}
		m.Audit(h.self, "resources-pending", map[string]any{"id": a.ID, "asked": req.Limits, "grant": o.Grant, "reason": req.Reason})
		writeJSON(w, http.StatusAccepted, a)
		return
	case err != nil:
		writeError(w, err)
		return
	}
	if len(d.raised) > 0 {
		m.Audit(h.self, "resources-granted", map[string]any{"asked": req.Limits, "raised": d.raised, "limits": info.Limits, "by": "policy", "reason": req.Reason})
	}
	writeJSON(w, http.StatusOK, &ResourcesGranted{State: "granted", Limits: info.Limits, Raised: d.raised})
}

// applyApproved applies a raise a person approved, to the running
// sandbox at once, checked against the ceiling as it is now.
func (in *Inside) applyApproved(ctx context.Context, a *Approval) error {
	var d raise
	info, err := in.m.ChangeLimits(ctx, a.Sandbox, func(cur sandbox.Limits) (sandbox.Limits, error) {
		d = decideRaise(cur, *a.Limits, in.o.MaxLimits, in.o.MaxLimits)
		if d.refused != "" {
			return cur, &Error{Code: "forbidden", Message: fmt.Sprintf("approve %s: sandbox %q asks for %s; deny it", a.ID, a.Sandbox, d.refused)}
		}
		return d.next, nil
	})
	if err != nil {
		return err
	}
	in.m.Audit(a.Sandbox, "resources-granted", map[string]any{"id": a.ID, "asked": *a.Limits, "raised": d.raised, "limits": info.Limits, "by": "a person"})
	return nil
}

// Check reports a grant past the ceiling, naming the field.
func (o InsideOptions) Check() error {
	g, m := levels(&o.Grant), levels(&o.MaxLimits)
	for i, v := range g {
		if !v.zero() && (m[i].zero() || m[i].less(v)) {
			return fmt.Errorf("grant %s=%s is above the ceiling %s=%s (0: none); raise the ceiling (--inside-max) or lower the grant", v.flag, v, v.flag, m[i])
		}
	}
	return nil
}
