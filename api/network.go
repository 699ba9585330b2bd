package api

import (
	"errors"
	"net/http"
	"strconv"

	"tine/netpolicy"
	"tine/sandbox"
)

// NetworkRequest is the body of PUT /v1/sandboxes/{name}/network, and the
// network of a CreateRequest (mode and allow only). With Mode, the policy
// becomes Mode and Allow; without, Add and Remove change the current
// allow-list (a sandbox in mode none that is given entries to add goes to
// mode allow).
type NetworkRequest struct {
	Mode   string   `json:"mode,omitempty"`
	Allow  []string `json:"allow,omitempty"`
	Add    []string `json:"add,omitempty"`
	Remove []string `json:"remove,omitempty"`
}

// Network is a sandbox's network as GET /v1/sandboxes/{name}/network
// reports it.
type Network = sandbox.NetworkStatus

// ExposeRequest is the body of POST /v1/sandboxes/{name}/exposures.
type ExposeRequest struct {
	Port int `json:"port"`
	// HostPort is the host's port (0: the same when free, otherwise any).
	HostPort int `json:"host_port,omitempty"`
	// HostAddress is where the host listens (default 127.0.0.1).
	HostAddress string `json:"host_address,omitempty"`
}

// Exposures is the answer of GET /v1/sandboxes/{name}/exposures.
type Exposures struct {
	Auto      bool               `json:"auto"`
	Exposures []sandbox.Exposure `json:"exposures"`
}

// AutoExposeRequest is the body of PUT /v1/sandboxes/{name}/exposures/auto.
type AutoExposeRequest struct {
	Enabled bool `json:"enabled"`
}

// SecretRequest is the body of PUT /v1/secrets/{secret}.
type SecretRequest struct {
	Value string `json:"value"`
}

// policy returns the policy a create request asks for (nil: none given).
func (n *NetworkRequest) policy() (*netpolicy.Policy, error) {
	if n == nil {
		return nil, nil
	}
	if len(n.Add)+len(n.Remove) > 0 {
		return nil, badRequest("field \"network\": a new sandbox takes mode and allow, not add or remove")
	}
	p, err := netpolicy.Parse(n.Mode, n.Allow)
	if err != nil {
		return nil, badRequest("field \"network\": %v", err)
	}
	return p, nil
}

// createPolicy checks a create request's network, secrets and
// auto-expose and puts them in o.
func (s *Server) createPolicy(req *CreateRequest, o *sandbox.CreateOptions) error {
	p, err := req.Network.policy()
	if err != nil {
		return err
	}
	o.Network, o.AutoExpose = p, req.AutoExpose
	if len(req.Secrets) == 0 {
		return nil
	}
	if len(req.Secrets) > 64 {
		return badRequest("field \"secrets\": %d bindings, at most 64", len(req.Secrets))
	}
	for _, b := range req.Secrets {
		if _, err := sandbox.ParseSecretBinding(b.String()); err != nil {
			return badRequest("field \"secrets\": %v", err)
		}
	}
	o.Secrets = req.Secrets
	return nil
}

// secretErr maps the sandbox package's errors about secrets, ports and
// policies to the API's codes.
func secretErr(err error) error {
	switch {
	case errors.Is(err, sandbox.ErrNoSecret):
		return &Error{Code: "not_found", Message: err.Error()}
	case errors.Is(err, sandbox.ErrBadPort), errors.Is(err, sandbox.ErrBinding):
		return badRequest("%v", err)
	}
	return err
}

func (s *Server) network(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	st, err := s.m.NetworkState(name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// changedPolicy applies a NetworkRequest to the current policy cur.
func changedPolicy(cur *netpolicy.Policy, req *NetworkRequest) (*netpolicy.Policy, error) {
	if req.Mode != "" {
		if len(req.Add)+len(req.Remove) > 0 {
			return nil, badRequest("give mode (with allow) or add and remove, not both")
		}
		p, err := netpolicy.Parse(req.Mode, req.Allow)
		if err != nil {
			return nil, badRequest("%v", err)
		}
		return p, nil
	}
	if len(req.Allow) > 0 {
		return nil, badRequest("field \"allow\" needs field \"mode\" (or use add and remove)")
	}
	if len(req.Add)+len(req.Remove) == 0 {
		return nil, badRequest("nothing to change: give mode, add or remove")
	}
	mode := cur.GetMode()
	if mode == netpolicy.Open {
		return nil, badRequest("mode open allows every address: set mode allow with a list instead")
	}
	list := append([]string(nil), cur.Allow...)
	for _, e := range req.Remove {
		rule, err := netpolicy.ParseRule(e)
		if err != nil {
			return nil, badRequest("%v", err)
		}
		found := false
		for i, have := range list {
			if have == rule.String() {
				list = append(list[:i], list[i+1:]...)
				found = true
				break
			}
		}
		if !found {
			return nil, badRequest("%s is not in the allow-list (%d entries)", rule, len(list))
		}
	}
	for _, e := range req.Add {
		rule, err := netpolicy.ParseRule(e)
		if err != nil {
			return nil, badRequest("%v", err)
		}
		dup := false
		for _, have := range list {
			dup = dup || have == rule.String()
		}
		if !dup {
			list = append(list, rule.String())
		}
	}
	p, err := netpolicy.Parse(string(netpolicy.Allow), list)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return p, nil
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	var req NetworkRequest
	if !decode(w, r, &req) {
		return
	}
	cur, err := s.m.Network(name)
	if err != nil {
		writeError(w, err)
		return
	}
	p, err := changedPolicy(cur, &req)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := s.context(r)
	defer cancel()
	if err := s.m.SetNetwork(ctx, name, p); err != nil {
		writeError(w, err)
		return
	}
	st, err := s.m.NetworkState(name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) exposures(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	ex, err := s.m.Exposures(name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, &Exposures{Auto: s.m.AutoExpose(name), Exposures: ex})
}

func (s *Server) expose(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	var req ExposeRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Port < 1 || req.Port > 65535 || req.HostPort < 0 || req.HostPort > 65535 {
		writeError(w, badRequest("field \"port\" %d / \"host_port\" %d: ports are 1-65535 (host_port 0: the same when free)", req.Port, req.HostPort))
		return
	}
	ex, err := s.m.Expose(r.Context(), name, sandbox.ExposeOptions{Port: req.Port, HostPort: req.HostPort, Address: req.HostAddress})
	if err != nil {
		writeError(w, secretErr(err))
		return
	}
	writeJSON(w, http.StatusCreated, ex)
}

func (s *Server) unexpose(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeError(w, badRequest("port %q in the path: want 1-65535", r.PathValue("port")))
		return
	}
	if err := s.m.Unexpose(name, port); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) autoExpose(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	var req AutoExposeRequest
	if !decode(w, r, &req) {
		return
	}
	if err := s.m.SetAutoExpose(r.Context(), name, req.Enabled); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) secrets(w http.ResponseWriter, r *http.Request) {
	list, err := s.m.Secrets()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) setSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("secret")
	var req SecretRequest
	if !decode(w, r, &req) {
		return
	}
	if err := s.m.SetSecret(name, []byte(req.Value)); err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) removeSecret(w http.ResponseWriter, r *http.Request) {
	if err := s.m.RemoveSecret(r.PathValue("secret")); err != nil {
		writeError(w, secretErr(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
