package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"tine/audit"
)

func (a *app) auditCommand() *cobra.Command {
	var follow bool
	var from int64
	c := &cobra.Command{
		Use:   "audit [SB]",
		Short: "print a sandbox's audit log (or the daemon's, without SB); audit verify checks one",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := c.Context()
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			cl, err := a.daemon(ctx)
			if err != nil {
				return err
			}
			rc, err := cl.Audit(ctx, name, from, follow)
			if err != nil {
				return sbErr(name, err)
			}
			defer rc.Close()
			return audit.ReadAll(rc, 0, func(r *audit.Record) error {
				if a.json {
					b, err := json.Marshal(r)
					if err != nil {
						return err
					}
					_, err = fmt.Fprintf(a.stdout, "%s\n", b)
					return err
				}
				_, err := fmt.Fprintf(a.stdout, "%5d  %s  %-16s %s\n", r.Seq, r.Time.Local().Format("2006-01-02 15:04:05.000"), r.Kind, fieldsText(r.Fields))
				return err
			})
		},
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new records")
	c.Flags().Int64Var(&from, "from", 0, "first record to print")
	c.AddCommand(a.auditVerifyCommand())
	return c
}

// fieldsText writes a record's fields as key=value, keys sorted.
func fieldsText(raw json.RawMessage) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return shown(string(raw))
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", k, shown(string(m[k])))
	}
	return b.String()
}

func (a *app) auditVerifyCommand() *cobra.Command {
	var head string
	c := &cobra.Command{
		Use:   "verify [SB]",
		Short: "check an audit log's chain and its end: edits, removed or reordered records and truncation are reported",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := c.Context()
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			cl, err := a.daemon(ctx)
			if err != nil {
				return err
			}
			resp, err := cl.VerifyAudit(ctx, name, head)
			if err != nil {
				return sbErr(name, err)
			}
			if a.json {
				if err := writeJSON(a.stdout, resp); err != nil {
					return err
				}
			} else if resp.Report.OK() {
				fmt.Fprintf(a.stdout, "audit log %s: whole, %d records, head %s\n", resp.Log, resp.Report.Records, resp.Report.Head)
				fmt.Fprintf(a.stderr, "keep the head elsewhere and pass it with --head to catch a log rewritten whole\n")
			} else {
				fmt.Fprintf(a.stdout, "audit log %s: DAMAGED after %d sound records\n", resp.Log, resp.Report.Records)
				for _, p := range resp.Report.Problems {
					fmt.Fprintf(a.stdout, "  %s\n", p)
				}
			}
			if !resp.Report.OK() {
				return exitCode(1)
			}
			return nil
		},
	}
	c.Flags().StringVar(&head, "head", "", "\"SEQ HASH\" printed by an earlier verify: the log must still hold that record")
	return c
}
