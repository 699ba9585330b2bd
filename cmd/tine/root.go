package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"tine/chunkstore"
	"tine/cowfs"
)

// builtinRoot is the state root used when neither --root nor $TINE_ROOT
// names one. It is the only root a command other than "tine init" may
// create, on its first use.
const builtinRoot = "/var/lib/tine"

func defaultRoot() string {
	if r := os.Getenv("TINE_ROOT"); r != "" {
		return r
	}
	return userRoot()
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
		if filepath.Clean(dir) != userRoot() {
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

// initCommand is "tine init": make the --root directory a state root.
func (a *app) initCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "init",
		Short: "create a state root (--root DIR; default $TINE_ROOT or " + builtinRoot + ")",
		Args:  nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			return a.runInit()
		},
	}
}

func (a *app) runInit() error {
	w := a.stdout
	dir, err := filepath.Abs(a.root)
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
	if a.json {
		return writeJSON(w, map[string]any{"root": dir, "created": !existed})
	}
	if existed {
		fmt.Fprintf(w, "%s is already a state root\n", dir)
	} else {
		fmt.Fprintf(w, "created state root %s\n", dir)
	}
	return nil
}
