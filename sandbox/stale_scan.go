package sandbox

import (
	"context"

	"tine/cowfs"
)

// StaleMaxEntries is the bound of tine status's metadata scan: it stops
// after looking at about this many entries and reports a partial count.
const StaleMaxEntries = staleMaxEntries

// ScanHost is the metadata scan tine status runs for a plain directory:
// it compares host directory dir with snapshot snap (what it was imported
// as) by type, size, mode, owner and modification time, reading no file,
// and stops after maxEntries entries. It is exported for benchmarks.
func ScanHost(ctx context.Context, fs *cowfs.FS, snap cowfs.SnapshotID, dir string, maxEntries int) (Staleness, error) {
	return compareHost(ctx, fs, snap, dir, maxEntries)
}
