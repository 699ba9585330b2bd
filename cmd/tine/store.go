package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/spf13/cobra"

	"tine/chunkstore"
)

// storeCommand is the "tine store" family: commands on a chunk store
// directory (the state root's is ROOT/store).
func (a *app) storeCommand() *cobra.Command {
	g := group("store", "a chunk store directory: stats, verify, gc, refs, recover, rebuild-index")
	one := func(name, short string, run func(ctx context.Context, dir string, asJSON bool, stdout io.Writer) error) *cobra.Command {
		return &cobra.Command{
			Use:   name + " DIR",
			Short: short,
			Args:  nArgs("DIR"),
			RunE: func(c *cobra.Command, args []string) error {
				return run(c.Context(), args[0], a.json, a.stdout)
			},
		}
	}
	g.AddCommand(
		one("stats", "show a chunk store's sizes and ratios", runStoreStats),
		one("verify", "read and check every object of a chunk store", runStoreVerify),
		one("gc", "remove objects no ref reaches from a chunk store", runStoreGC),
		one("recover", "bring back refs and index a damaged chunk store lost", runStoreRecover),
		one("rebuild-index", "rebuild a chunk store's index from its packs", runStoreRebuildIndex),
		&cobra.Command{
			Use:   "refs DIR [PREFIX]",
			Short: "list a chunk store's refs (optionally under a prefix)",
			Args:  rangeArgs(1, 2, "a store directory and an optional prefix"),
			RunE: func(c *cobra.Command, args []string) error {
				prefix := ""
				if len(args) == 2 {
					prefix = args[1]
				}
				return runStoreRefs(c.Context(), args[0], prefix, a.json, a.stdout)
			},
		},
	)
	return g
}

// openStore opens the store in dir, which must already be one: unlike
// chunkstore.Open, it never creates a store in a wrong directory.
func openStore(dir string, opts *chunkstore.Options) (*chunkstore.Store, error) {
	if err := needStore(dir); err != nil {
		return nil, err
	}
	return chunkstore.Open(dir, opts)
}

func needStore(dir string) error {
	ok, err := chunkstore.IsStore(dir)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s is not a tine store (it has no tine-store marker; nothing was created): %w", dir, chunkstore.ErrNotStore)
	}
	return nil
}

// progress prints a long repair's progress on stderr, on one line.
func progress(phase string, done, total int64) {
	fmt.Fprintf(os.Stderr, "\r%s: %d/%d", phase, done, total)
	if done == total {
		fmt.Fprintln(os.Stderr)
	}
}

func runStoreRecover(ctx context.Context, dir string, asJSON bool, stdout io.Writer) error {
	rep, err := chunkstore.Recover(ctx, dir, progress)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, rep)
	}
	for _, d := range rep.Damaged {
		fmt.Fprintln(stdout, "damaged:", d)
	}
	for _, d := range rep.Unreadable {
		fmt.Fprintln(stdout, "unreadable:", d)
	}
	for _, n := range rep.Added {
		fmt.Fprintln(stdout, "added", n)
	}
	rebuilt := ""
	if rep.Rebuilt {
		rebuilt = fmt.Sprintf("index rebuilt (%d objects in %d packs); ", rep.Index.Objects, rep.Index.Packs)
	}
	fmt.Fprintf(stdout, "%sread %d nodes: %d roots, %d refs added; %d problems found\n", rebuilt, rep.Nodes, rep.Roots, len(rep.Added), len(rep.Damaged)+len(rep.Unreadable)+len(rep.Index.Damaged))
	return nil
}

func runStoreRebuildIndex(ctx context.Context, dir string, asJSON bool, stdout io.Writer) error {
	rep, err := chunkstore.RebuildIndex(ctx, dir, progress)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, rep)
	}
	for _, d := range rep.Damaged {
		fmt.Fprintln(stdout, "damaged:", d)
	}
	for _, d := range rep.Tails {
		fmt.Fprintln(stdout, "ignored:", d)
	}
	fmt.Fprintf(stdout, "scanned %d packs: %d objects indexed in %s; %d damaged records skipped\n", rep.Packs, rep.Objects, rep.Index, len(rep.Damaged))
	return nil
}

func runStoreStats(ctx context.Context, dir string, asJSON bool, stdout io.Writer) error {
	s, err := openStore(dir, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	st := s.Stats()
	if asJSON {
		return writeJSON(stdout, st)
	}
	fmt.Fprintf(stdout, "store             %s\n", dir)
	fmt.Fprintf(stdout, "logical bytes     %d (%s)\n", st.LogicalBytes, humanBytes(st.LogicalBytes))
	fmt.Fprintf(stdout, "unique bytes      %d (%s) in %d chunks\n", st.UniqueBytes, humanBytes(st.UniqueBytes), st.Chunks)
	fmt.Fprintf(stdout, "node bytes        %d (%s) in %d nodes\n", st.NodeBytes, humanBytes(st.NodeBytes), st.Nodes)
	fmt.Fprintf(stdout, "stored bytes      %d (%s) in %d packs\n", st.StoredBytes, humanBytes(st.StoredBytes), st.Packs)
	fmt.Fprintf(stdout, "dedup ratio       %.2f\n", st.DedupRatio)
	fmt.Fprintf(stdout, "compression ratio %.2f\n", st.CompressionRatio)
	fmt.Fprintf(stdout, "refs              %d\n", st.Refs)
	return nil
}

func runStoreVerify(ctx context.Context, dir string, asJSON bool, stdout io.Writer) error {
	// Open even a damaged store, so that every problem gets reported.
	s, err := openStore(dir, &chunkstore.Options{AllowDamaged: true})
	if err != nil {
		return err
	}
	defer s.Close()
	rep, err := s.Verify(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		for _, d := range rep.Damaged {
			fmt.Fprintln(stdout, "damaged:", d)
		}
	}
	if !asJSON {
		fmt.Fprintf(stdout, "checked %d objects (%s) and %d refs: %d problems\n", rep.Objects, humanBytes(rep.Bytes), rep.Refs, len(rep.Damaged))
	}
	if !rep.OK() {
		return fmt.Errorf("store %s: %d problems found", dir, len(rep.Damaged))
	}
	return nil
}

func runStoreGC(ctx context.Context, dir string, asJSON bool, stdout io.Writer) error {
	// A fresh process holds no ids in memory: no grace period is needed.
	s, err := openStore(dir, &chunkstore.Options{GCGrace: -1})
	if err != nil {
		return err
	}
	st, err := s.GC(ctx)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, st)
	}
	fmt.Fprintf(stdout, "kept %d objects, deleted %d (%s); packs: %d deleted, %d rewritten (%d objects copied); %d reachable objects missing; %s\n",
		st.Live, st.Deleted, humanBytes(st.DeletedBytes), st.PacksDeleted, st.PacksRepacked, st.RepackedObjects, st.Missing, st.Duration.Round(1e6))
	return nil
}

func runStoreRefs(ctx context.Context, dir, prefix string, asJSON bool, stdout io.Writer) error {
	s, err := openStore(dir, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	refs, err := s.ListRefs(prefix)
	if err != nil {
		return err
	}
	if asJSON {
		m := make(map[string]string, len(refs))
		for n, id := range refs {
			m[n] = fmt.Sprint(id)
		}
		return writeJSON(stdout, m)
	}
	names := make([]string, 0, len(refs))
	for n := range refs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(stdout, "%s %s\n", refs[n], n)
	}
	return nil
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
