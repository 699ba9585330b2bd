package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"tine/execpolicy"
)

func (a *app) approvalsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "approvals",
		Short: "list the commands waiting for a person's approval",
		Args:  nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			as, err := cl.Approvals(c.Context())
			if err != nil {
				return err
			}
			if a.json {
				return writeJSON(a.stdout, as)
			}
			return table(a.stdout, "ID\tSANDBOX\tASKED\tFROZEN\tCOMMAND", func(tw io.Writer) {
				for _, ap := range as {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", ap.ID, ap.Sandbox, ap.Asked.Local().Format("15:04:05"), ap.Frozen, strings.Join(ap.Argv, " "))
				}
			})
		},
	}
}

func (a *app) decideCommand(approve bool) *cobra.Command {
	use, short, verb := "approve ID...", "let commands waiting for approval run", "approved"
	if !approve {
		use, short, verb = "deny ID...", "refuse commands waiting for approval", "denied"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  minArgs(1, "one or more approval ids (tine approvals lists them)"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			by := os.Getenv("USER")
			for _, id := range args {
				ap, err := cl.Decide(c.Context(), id, approve, by)
				if err != nil {
					return fmt.Errorf("%v; tine approvals lists those waiting", apiError(err))
				}
				if a.json {
					writeJSON(a.stdout, map[string]any{verb: ap})
				} else {
					fmt.Fprintf(a.stdout, "%s %s in %s: %s\n", verb, ap.ID, ap.Sandbox, strings.Join(ap.Argv, " "))
				}
			}
			return nil
		},
	}
}

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
