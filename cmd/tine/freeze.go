package main

import (
	"github.com/spf13/cobra"

	"tine/api/client"
)

func (a *app) freezeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "freeze SB...",
		Short: "freeze sandboxes: their processes stop (no CPU) with memory and sockets kept, until thaw",
		Args:  minArgs(1, "one or more sandboxes"),
		RunE: func(c *cobra.Command, args []string) error {
			return a.eachSandbox(c.Context(), args, "frozen", func(cl *client.Client, n string) error {
				return cl.Freeze(c.Context(), n)
			})
		},
	}
}

func (a *app) thawCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "thaw SB...",
		Short: "resume frozen sandboxes",
		Args:  minArgs(1, "one or more sandboxes"),
		RunE: func(c *cobra.Command, args []string) error {
			return a.eachSandbox(c.Context(), args, "thawed", func(cl *client.Client, n string) error {
				return cl.Thaw(c.Context(), n)
			})
		},
	}
}
