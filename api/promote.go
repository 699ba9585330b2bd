package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"tine/cowfs"
	"tine/sandbox"
)

// PromoteRequest is the body of POST /v1/sandboxes/{name}/promote: a
// three-way promotion into a directory (the default), the resume or
// abort of one that stopped partway, or a commit on a new git branch.
type PromoteRequest struct {
	DryRun      bool `json:"dry_run,omitempty"`
	AllowSetid  bool `json:"allow_setid,omitempty"`
	AllowDevice bool `json:"allow_devices,omitempty"`
	KeepOwners  bool `json:"keep_owners,omitempty"`
	// To is the host directory to promote into (default: the one the
	// sandbox was made from).
	To string `json:"to,omitempty"`
	// Partial applies what merges cleanly when some paths conflict.
	Partial bool `json:"partial,omitempty"`
	// Resume finishes, Abort undoes, a promotion that stopped partway.
	Resume bool `json:"resume,omitempty"`
	Abort  bool `json:"abort,omitempty"`
	// Git promotes to a new branch of the host repository instead:
	// GitBranch names it (empty: the one a fork with git_branches
	// recorded). Message and Author ("Name <email>") are the commit's;
	// Onto a revision to merge onto three ways ("HEAD"); KeepCommits
	// keeps the commits the sandbox made in its own copy.
	Git         bool   `json:"git,omitempty"`
	GitBranch   string `json:"git_branch,omitempty"`
	Message     string `json:"message,omitempty"`
	Author      string `json:"author,omitempty"`
	Onto        string `json:"onto,omitempty"`
	KeepCommits bool   `json:"keep_commits,omitempty"`
	// Verify is a check (sh -c, in the project directory) run first on
	// the result in a sandbox of its own; nothing is written unless it
	// exits 0. VerifyTimeoutS bounds it in seconds; KeepVerify keeps its
	// sandbox for inspection.
	Verify         string `json:"verify,omitempty"`
	VerifyTimeoutS int    `json:"verify_timeout_s,omitempty"`
	KeepVerify     bool   `json:"keep_verify,omitempty"`
}

// PromoteResponse reports what a promote did or would do. When it was
// refused for conflicts, Applied is false and Error says why; the lists
// say where.
type PromoteResponse struct {
	Changes   []Change         `json:"changes"`
	Conflicts []cowfs.Conflict `json:"conflicts,omitempty"`
	Refused   []cowfs.Refusal  `json:"refused,omitempty"`
	Applied   bool             `json:"applied"`
	// Merge lists the paths changed on both sides that could not be
	// combined, with both sides; Merged the text files combined line by
	// line.
	Merge  []sandbox.MergeConflict `json:"merge_conflicts,omitempty"`
	Merged []string                `json:"merged,omitempty"`
	// HostChanged counts the paths the host changed since the sandbox's
	// base; HostExamples names a few.
	HostChanged  int      `json:"host_changed"`
	HostExamples []string `json:"host_examples,omitempty"`
	Dir          string   `json:"dir,omitempty"`
	// Git is the outcome of a promotion to a git branch.
	Git *sandbox.GitPromoteResult `json:"git,omitempty"`
	// Verify is the check's outcome (its command, exit code and the end
	// of its output); Record the file in the state root that keeps it.
	Verify *sandbox.VerifyResult `json:"verify,omitempty"`
	Record string                `json:"record,omitempty"`
	Error  *Error                `json:"error,omitempty"`
}

func (req *PromoteRequest) options() sandbox.PromoteOptions {
	return sandbox.PromoteOptions{PromoteOptions: cowfs.PromoteOptions{DryRun: req.DryRun,
		Privileges: cowfs.HostPrivileges{SetID: req.AllowSetid, Devices: req.AllowDevice, Owners: req.KeepOwners}},
		To: req.To, Partial: req.Partial, Verify: req.verify()}
}

func (req *PromoteRequest) verify() sandbox.VerifyOptions {
	return sandbox.VerifyOptions{Command: req.Verify, Timeout: time.Duration(req.VerifyTimeoutS) * time.Second, Keep: req.KeepVerify}
}

// promoteErr is the error a promotion answers in its body (true), or
// false for one answered as an HTTP error.
func promoteErr(err error) (*Error, bool) {
	switch {
	case err == nil:
		return nil, true
	case errors.Is(err, sandbox.ErrVerifyFailed):
		return &Error{Code: "verify_failed", Message: err.Error()}, true
	case errors.Is(err, cowfs.ErrConflict) || errors.Is(err, cowfs.ErrCannotApply):
		return &Error{Code: "conflict", Message: err.Error()}, true
	}
	return nil, false
}

func (s *Server) promote(w http.ResponseWriter, r *http.Request) {
	name, ok := s.known(w, r)
	if !ok {
		return
	}
	var req PromoteRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Resume && req.Abort {
		writeError(w, badRequest("give at most one of \"resume\" and \"abort\""))
		return
	}
	if req.Verify != "" && (req.Resume || req.Abort) {
		writeError(w, badRequest("\"verify\" goes with a new promotion, not \"resume\" or \"abort\""))
		return
	}
	ctx := context.WithoutCancel(r.Context())
	if req.Git || req.GitBranch != "" {
		s.promoteGit(w, ctx, name, req)
		return
	}
	var res *sandbox.PromoteResult
	var err error
	switch {
	case req.Resume:
		res, err = s.m.ResumePromote(ctx, name)
	case req.Abort:
		res, err = s.m.AbortPromote(ctx, name)
	default:
		res, err = s.m.Promote(ctx, name, req.options())
	}
	e, inBody := promoteErr(err)
	if res == nil || !inBody {
		writeError(w, err)
		return
	}
	out := promoteResponse(res)
	out.Error = e
	writeJSON(w, http.StatusOK, out)
}

// promoteResponse is the API form of a promotion's result.
func promoteResponse(res *sandbox.PromoteResult) *PromoteResponse {
	out := &PromoteResponse{Changes: []Change{}, Merge: res.Merge, Merged: res.Merged,
		HostChanged: res.HostChanged, HostExamples: res.HostExamples, Dir: res.Dir, Verify: res.Verify, Record: res.Record}
	if c := res.PromoteResult; c != nil {
		out.Changes, out.Conflicts, out.Refused, out.Applied = changesOf(c.Changes), c.Conflicts, c.Refused, c.Applied
	}
	return out
}

// forkBranches expands a fork request's git branch template (nil when it
// gives none). It names the forks in fo, so that each branch goes to the
// fork it was made for.
func (s *Server) forkBranches(ctx context.Context, name string, req ForkRequest, fo *sandbox.ForkOptions) ([]string, error) {
	if req.GitBranches == "" {
		return nil, nil
	}
	names, err := s.m.ForkNames(name, *fo)
	if err != nil {
		return nil, err
	}
	b, err := s.m.GitBranchNames(ctx, name, req.GitBranches, names)
	if err != nil {
		return nil, badRequest("%s", err)
	}
	fo.Names = names
	return b, nil
}

// setForkBranches records each fork's branch.
func (s *Server) setForkBranches(infos []*sandbox.Info, branches []string) error {
	for i, b := range branches {
		if err := s.m.SetGitBranch(infos[i].Name, b); err != nil {
			return err
		}
		infos[i].GitBase.Branch = b
	}
	return nil
}

// promoteGit answers a promotion to a git branch.
func (s *Server) promoteGit(w http.ResponseWriter, ctx context.Context, name string, req PromoteRequest) {
	if req.Resume || req.Abort || req.To != "" || req.Partial {
		writeError(w, badRequest("a promotion to a git branch takes none of \"to\", \"partial\", \"resume\" and \"abort\""))
		return
	}
	res, err := s.m.PromoteGit(ctx, name, sandbox.GitPromoteOptions{Branch: req.GitBranch, Message: req.Message,
		Author: req.Author, Onto: req.Onto, KeepCommits: req.KeepCommits, DryRun: req.DryRun, Verify: req.verify()})
	e, inBody := promoteErr(err)
	if res == nil || !inBody {
		writeError(w, err)
		return
	}
	out := &PromoteResponse{Changes: []Change{}, Git: res, Merge: res.Merge, Merged: res.Merged, Applied: res.Applied, Dir: res.Repo,
		Verify: res.Verify, Record: res.Record, Error: e}
	writeJSON(w, http.StatusOK, out)
}
