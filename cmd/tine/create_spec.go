package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tine/spec"
)

// specFlags are create's flags that read an environment spec.
type specFlags struct {
	file, devcontainer string
}

func (sf *specFlags) flags(f *pflag.FlagSet) {
	f.StringVarP(&sf.file, "file", "f", "", "create from an environment spec, tine.yaml (see docs/spec.md)")
	f.StringVar(&sf.devcontainer, "devcontainer", "", "create from a devcontainer.json (its features install as setup steps; its initializeCommand is refused: it would run on the host)")
}

// createFromSpec creates the sandbox a tine.yaml or devcontainer.json
// describes; setup steps are cached under the state root.
func (a *app) createFromSpec(c *cobra.Command, sf specFlags, name string) error {
	if sf.file != "" && sf.devcontainer != "" {
		return usageErr("give -f or --devcontainer, not both")
	}
	for _, fl := range []string{"from", "service", "env", "pids", "disk", "memory", "cpus", "network", "allow", "secret", "lifetime", "message-to"} {
		if c.Flags().Changed(fl) {
			return usageErr("--%s: the spec says it; edit the spec instead", fl)
		}
	}
	var s *spec.Spec
	var err error
	if sf.file != "" {
		s, err = spec.Load(sf.file)
	} else {
		var root string
		if root, err = filepath.Abs(a.root); err != nil {
			return err
		}
		s, err = spec.LoadDevcontainer(c.Context(), sf.devcontainer, &spec.FeatureFetcher{Dir: filepath.Join(root, "features")})
	}
	if err != nil {
		return usageErr("%v", err)
	}
	if name != "" {
		s.Name = name
	}
	ctx := c.Context()
	cl, err := a.daemon(ctx)
	if err != nil {
		return err
	}
	root, err := filepath.Abs(a.root)
	if err != nil {
		return err
	}
	b := &spec.Builder{Client: cl, Cache: spec.Cache{Dir: filepath.Join(root, "setup-cache")}, Log: a.stderr}
	r, err := b.Build(ctx, s)
	if err != nil {
		if s.Base.Image != "" && isNotFound(err) && strings.Contains(err.Error(), "image") {
			return fmt.Errorf("base.image: %w", imgErr(s.Base.Image, err))
		}
		return sbErr(s.Name, err)
	}
	if a.json {
		return writeJSON(a.stdout, r.Sandbox)
	}
	fmt.Fprintf(a.stdout, "%s\n", r.Sandbox.Name)
	fmt.Fprintf(a.stderr, "created sandbox %s from %s: %d setup steps from the cache, %d run; run commands with \"tine exec %s -- CMD\"\n",
		r.Sandbox.Name, s.Base.Dir, r.Cached, r.Ran, r.Sandbox.Name)
	return nil
}
