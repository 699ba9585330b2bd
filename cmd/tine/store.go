package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	"tine/chunkstore"
)

func init() {
	register(command{name: "store stats", summary: "show a chunk store's sizes and ratios (--json)", run: runStoreStats})
	register(command{name: "store verify", summary: "read and check every object of a chunk store", run: runStoreVerify})
	register(command{name: "store gc", summary: "remove objects no ref reaches from a chunk store", run: runStoreGC})
	register(command{name: "store refs", summary: "list a chunk store's refs (optionally under a prefix)", run: runStoreRefs})
	register(command{name: "store recover", summary: "bring back refs and index a damaged chunk store lost (--json)", run: runStoreRecover})
	register(command{name: "store rebuild-index", summary: "rebuild a chunk store's index from its packs (--json)", run: runStoreRebuildIndex})
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

func runStoreRecover(ctx context.Context, args []string, stdout io.Writer) error {
	var asJSON bool
	dir, err := storeArgs("store recover", args, func(fs *flag.FlagSet) { fs.BoolVar(&asJSON, "json", false, "print JSON") })
	if err != nil {
		return err
	}
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

func runStoreRebuildIndex(ctx context.Context, args []string, stdout io.Writer) error {
	var asJSON bool
	dir, err := storeArgs("store rebuild-index", args, func(fs *flag.FlagSet) { fs.BoolVar(&asJSON, "json", false, "print JSON") })
	if err != nil {
		return err
	}
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

// storeArgs parses flags (before or after the directory) and the one
// store directory argument.
func storeArgs(name string, args []string, setup func(*flag.FlagSet)) (string, error) {
	fs := newFlags(name)
	if setup != nil {
		setup(fs)
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return "", err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != 1 {
		return "", usageErr("%s: want one store directory, got %d arguments", name, len(pos))
	}
	return pos[0], nil
}

func runStoreStats(ctx context.Context, args []string, stdout io.Writer) error {
	var asJSON bool
	dir, err := storeArgs("store stats", args, func(fs *flag.FlagSet) { fs.BoolVar(&asJSON, "json", false, "print JSON") })
	if err != nil {
		return err
	}
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

func runStoreVerify(ctx context.Context, args []string, stdout io.Writer) error {
	dir, err := storeArgs("store verify", args, nil)
	if err != nil {
		return err
	}
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
	for _, d := range rep.Damaged {
		fmt.Fprintln(stdout, "damaged:", d)
	}
	fmt.Fprintf(stdout, "checked %d objects (%s) and %d refs: %d problems\n", rep.Objects, humanBytes(rep.Bytes), rep.Refs, len(rep.Damaged))
	if !rep.OK() {
		return fmt.Errorf("store %s: %d problems found", dir, len(rep.Damaged))
	}
	return nil
}

func runStoreGC(ctx context.Context, args []string, stdout io.Writer) error {
	dir, err := storeArgs("store gc", args, nil)
	if err != nil {
		return err
	}
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
	fmt.Fprintf(stdout, "kept %d objects, deleted %d (%s); packs: %d deleted, %d rewritten (%d objects copied); %d reachable objects missing; %s\n",
		st.Live, st.Deleted, humanBytes(st.DeletedBytes), st.PacksDeleted, st.PacksRepacked, st.RepackedObjects, st.Missing, st.Duration.Round(1e6))
	return nil
}

func runStoreRefs(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("store refs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() < 1 || fs.NArg() > 2 {
		return usageErr("store refs: want a store directory and an optional prefix")
	}
	s, err := openStore(fs.Arg(0), nil)
	if err != nil {
		return err
	}
	defer s.Close()
	refs, err := s.ListRefs(fs.Arg(1))
	if err != nil {
		return err
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
