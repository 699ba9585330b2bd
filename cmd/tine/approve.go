package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"tine/api"
)

// approvalCommands: what code inside sandboxes asked a person for, and
// the person's answers.
func (a *app) approvalCommands() []*cobra.Command {
	var sb string
	list := &cobra.Command{
		Use:   "approvals",
		Short: "list what code inside sandboxes asked a person for (answer with tine approve|deny ID)",
		Args:  nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			as, err := cl.Approvals(c.Context(), sb)
			if err != nil {
				return apiError(err)
			}
			if a.json {
				if as == nil {
					as = []api.Approval{}
				}
				return writeJSON(a.stdout, as)
			}
			return table(a.stdout, "ID\tSANDBOX\tKIND\tSTATE\tREASON", func(w io.Writer) {
				for _, ap := range as {
					reason := ap.Reason
					if l := ap.Limits; l != nil {
						var asked []string
						for _, f := range []struct {
							name string
							v    int64
							s    string
						}{{"memory", l.MemoryBytes, humanBytes(l.MemoryBytes)}, {"cpus", int64(l.CPUs * 1e6), fmt.Sprint(l.CPUs)},
							{"pids", l.Pids, fmt.Sprint(l.Pids)}, {"disk", l.ProjectBytes, humanBytes(l.ProjectBytes)}} {
							if f.v != 0 {
								asked = append(asked, f.name+"="+f.s)
							}
						}
						reason = strings.TrimSpace("limits " + strings.Join(asked, ",") + " " + reason)
					}
					state := ap.State
					if ap.Frozen && ap.State == "pending" {
						state += " (sandbox frozen)"
					}
					if ap.TimedOut {
						state += " (timed out)"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%q\n", ap.ID, ap.Sandbox, ap.Kind, state, reason)
				}
			})
		},
	}
	list.Flags().StringVar(&sb, "sandbox", "", "only this sandbox's")
	answer := func(approve bool) *cobra.Command {
		var msg string
		verb, short := "deny", "deny a sandbox's pending request"
		if approve {
			verb, short = "approve", "approve a sandbox's pending request (a raise of limits applies at once; an answered question thaws the sandbox)"
		}
		c := &cobra.Command{
			Use:   verb + " ID",
			Short: short,
			Args:  nArgs("ID"),
			RunE: func(c *cobra.Command, args []string) error {
				cl, err := a.daemon(c.Context())
				if err != nil {
					return err
				}
				ap, err := cl.Answer(c.Context(), args[0], approve, msg)
				if err != nil {
					return apiError(err)
				}
				if a.json {
					return writeJSON(a.stdout, ap)
				}
				fmt.Fprintf(a.stdout, "%s %s (sandbox %s)\n", ap.ID, ap.State, ap.Sandbox)
				return nil
			},
		}
		c.Flags().StringVarP(&msg, "message", "m", "", "words for the sandbox that asked")
		return c
	}
	return []*cobra.Command{list, answer(true), answer(false)}
}
