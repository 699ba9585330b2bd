package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"tine/chunkstore"
	"tine/cowfs"
)

// builtinRoot is the state root used when neither --root nor $TINE_ROOT
// names one. It is the only root a command other than "tine init" may
// create, on its first use.
const builtinRoot = "/var/lib/tine"

func init() {
	register(command{name: "init", summary: "create a state root (--root DIR; default $TINE_ROOT or " + builtinRoot + ")", run: runInit})
}

func defaultRoot() string {
	if r := os.Getenv("TINE_ROOT"); r != "" {
		return r
	}
	return builtinRoot
}

// isRoot reports whether dir is a tine state root: one with a store.
func isRoot(dir string) (bool, error) {
	return chunkstore.IsStore(filepath.Join(dir, "store"))
}

// errNoRoot says that dir is not a state root and how to make one.
func errNoRoot(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("state root %s does not exist; create it with: tine init --root %s", dir, dir)
	}
	return fmt.Errorf("%s is not a tine state root (it has no store); create one with: tine init --root DIR, or pass the right --root", dir)
}

// openRoot opens the state root dir. Only the built-in default root is
// created on first use: any other missing or foreign directory is an
// error, so a mistyped --root never leaves state behind.
func openRoot(dir string) (*cowfs.FS, error) {
	ok, err := isRoot(dir)
	if err != nil {
		return nil, err
	}
	if !ok {
		if filepath.Clean(dir) != builtinRoot {
			return nil, errNoRoot(dir)
		}
		if err := initRoot(dir); err != nil {
			return nil, err
		}
	}
	return cowfs.Open(dir, nil)
}

// initRoot makes dir a state root. dir may exist if it is empty or
// already a root.
func initRoot(dir string) error {
	if ok, err := isRoot(dir); err != nil || ok {
		return err
	}
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create state root %s: %w", dir, err)
		}
	case err != nil:
		return fmt.Errorf("state root %s: %w", dir, err)
	case len(ents) > 0:
		return fmt.Errorf("%s is not empty and not a tine state root; choose an empty or new directory", dir)
	}
	f, err := cowfs.Open(dir, nil)
	if err != nil {
		return err
	}
	return f.Close()
}

func runInit(ctx context.Context, args []string, w io.Writer) error {
	fs := newFlags("init")
	root := fs.String("root", defaultRoot(), "directory to make a state root")
	jsonOut := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageErr("%v", err)
	}
	if fs.NArg() != 0 {
		return usageErr("init takes no arguments (use --root DIR)")
	}
	dir, err := filepath.Abs(*root)
	if err != nil {
		return err
	}
	existed, err := isRoot(dir)
	if err != nil {
		return err
	}
	if err := initRoot(dir); err != nil {
		return err
	}
	if *jsonOut {
		return writeJSON(w, map[string]any{"root": dir, "created": !existed})
	}
	if existed {
		fmt.Fprintf(w, "%s is already a state root\n", dir)
	} else {
		fmt.Fprintf(w, "created state root %s\n", dir)
	}
	return nil
}
