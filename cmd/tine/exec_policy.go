package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"tine/execpolicy"
)

func (a *app) execPolicyCommand() *cobra.Command {
	var set, file string
	var freeze bool
	c := &cobra.Command{
		Use:   "exec-policy SB [--set '{\"npm *\": \"allow\", \"rm -rf *\": \"deny\", \"*\": \"ask\"}']",
		Short: "show or set which commands a sandbox runs (allow), refuses (deny) or holds for approval (ask): a guard-rail, not a boundary",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := c.Context()
			cl, err := a.daemon(ctx)
			if err != nil {
				return err
			}
			name := args[0]
			p, err := cl.ExecPolicy(ctx, name)
			if err != nil {
				return sbErr(name, err)
			}
			if set != "" || file != "" || c.Flags().Changed("freeze-on-ask") {
				if file != "" {
					b, err := os.ReadFile(file)
					if err != nil {
						return usageErr("--file: %v", err)
					}
					set = string(b)
				}
				if set != "" {
					np, err := execpolicy.ParseMap([]byte(set))
					if err != nil {
						return usageErr("--set: %v", err)
					}
					np.FreezeOnAsk = p.FreezeOnAsk
					p = np
				}
				if c.Flags().Changed("freeze-on-ask") {
					p.FreezeOnAsk = freeze
				}
				if p, err = cl.SetExecPolicy(ctx, name, p); err != nil {
					return sbErr(name, err)
				}
			}
			if a.json {
				return writeJSON(a.stdout, p)
			}
			if len(p.Rules) == 0 {
				fmt.Fprintf(a.stdout, "no rules: every command runs\n")
			}
			for _, r := range p.Rules {
				fmt.Fprintf(a.stdout, "%-6s %s\n", r.Action, r.Pattern)
			}
			if p.FreezeOnAsk {
				fmt.Fprintf(a.stdout, "the sandbox is frozen while a command waits for approval\n")
			}
			return nil
		},
	}
	c.Flags().StringVar(&set, "set", "", "the new rules, a JSON object of pattern to allow, ask or deny")
	c.Flags().StringVar(&file, "file", "", "read the new rules from this file")
	c.Flags().BoolVar(&freeze, "freeze-on-ask", false, "freeze the sandbox while a command waits for approval")
	return c
}
