package sandbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// GitBranchNames expands a fork's branch template for n forks: "{i}"
// becomes 1..n and "{name}" the fork's name. It checks that sandbox
// name records a git base and that each name is a branch name the host
// repository does not hold yet.
func (m *Manager) GitBranchNames(ctx context.Context, name, template string, forks []string) ([]string, error) {
	info, err := m.Get(name)
	if err != nil {
		return nil, err
	}
	if info.GitBase.Commit == "" {
		return nil, fmt.Errorf("fork sandbox %q with git branches: %w (its directory %s was not the top of a git work tree with a commit)", name, ErrNoGitBase, info.ProjectPath)
	}
	if len(forks) > 1 && !strings.Contains(template, "{i}") && !strings.Contains(template, "{name}") {
		return nil, fmt.Errorf("fork sandbox %q: the branch template %q names every fork alike; put {i} or {name} in it", name, template)
	}
	g := &gitRepo{dir: info.ProjectPath}
	out := make([]string, len(forks))
	for i, f := range forks {
		b := strings.NewReplacer("{i}", strconv.Itoa(i+1), "{name}", f).Replace(template)
		if strings.HasPrefix(b, "-") {
			return nil, fmt.Errorf("fork sandbox %q: bad branch name %q", name, b)
		}
		if _, err := g.out(ctx, nil, "check-ref-format", "refs/heads/"+b); err != nil {
			return nil, fmt.Errorf("fork sandbox %q: bad branch name %q (see git check-ref-format)", name, b)
		}
		if _, err := g.rev(ctx, "refs/heads/"+b); err == nil {
			return nil, fmt.Errorf("fork sandbox %q: branch %q already exists in %s", name, b, g.dir)
		}
		out[i] = b
	}
	return out, nil
}

// SetGitBranch records the branch a promotion of sandbox name to git goes
// to when it names none (PromoteGit with an empty Branch).
func (m *Manager) SetGitBranch(name, branch string) error {
	info, err := m.Get(name)
	if err != nil {
		return err
	}
	if info.GitBase.Commit == "" {
		return fmt.Errorf("sandbox %q: %w", name, ErrNoGitBase)
	}
	info.GitBase.Branch = branch
	return m.save(info)
}

// GitStaleness says how far a git origin's HEAD moved since the commit a
// sandbox was made from.
type GitStaleness struct {
	Base string `json:"base"`
	Head string `json:"head"`
	// Commits counts the commits in Base..Head; Changed the paths that
	// differ between them, Examples names up to 10.
	Commits  int      `json:"commits"`
	Changed  int      `json:"changed"`
	Examples []string `json:"examples,omitempty"`
	// Unknown says why it could not be told (HEAD or the base gone).
	Unknown string `json:"unknown,omitempty"`
}

// gitStale is the git staleness of a sandbox with a git base.
func gitStale(ctx context.Context, info *Info) *GitStaleness {
	if info.GitBase.Commit == "" {
		return nil
	}
	g := &gitRepo{dir: info.ProjectPath}
	s := &GitStaleness{Base: info.GitBase.Commit}
	head, err := g.rev(ctx, "HEAD")
	if err != nil {
		s.Unknown = "the repository's HEAD: " + err.Error()
		return s
	}
	s.Head = head
	var r GitPromoteResult
	(&Manager{}).gitStaleness(ctx, g, s.Base, &r)
	s.Commits, s.Changed = r.HostCommits, len(r.HostChanged)
	s.Examples = r.HostChanged[:min(len(r.HostChanged), staleExamples)]
	return s
}
