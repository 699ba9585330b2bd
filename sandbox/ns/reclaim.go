package ns

import (
	"context"
	"fmt"
	"time"

	"tine/sandbox/internal/cgroup"
)

// Reclaim ends what the sandbox of Spec.ID id left on the host when the
// process that started it died without stopping it: processes still in
// its cgroups (frozen ones among them: a snapshot interrupted midway
// leaves them frozen, and a frozen process does not die of the kill its
// parent's death sends) and the cgroups themselves. It says what it
// found, or "" when there was nothing. In rootless mode there are no
// cgroups, and the processes died with the user namespace's owner.
func (r *Runtime) Reclaim(ctx context.Context, id string) (string, error) {
	if Rootless() {
		return "", nil
	}
	g := cgroup.Existing(id)
	if g == nil {
		return "", nil
	}
	frozen := g.Frozen()
	pids, _ := g.Pids()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := g.Remove(ctx); err != nil {
		return "", fmt.Errorf("reclaim sandbox %s: %w", id, err)
	}
	switch {
	case frozen:
		return fmt.Sprintf("thawed and killed %d processes left frozen in its cgroup, and removed it", len(pids)), nil
	case len(pids) > 0:
		return fmt.Sprintf("killed %d processes left in its cgroup, and removed it", len(pids)), nil
	}
	return "removed its empty cgroup", nil
}
