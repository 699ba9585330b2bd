package main

import (
	"github.com/spf13/cobra"
)

// completionCommand prints a shell completion script (cobra's).
func (a *app) completionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "print a shell completion script",
		Long: "completion prints a completion script for the shell. For example:\n" +
			"  tine completion bash > /etc/bash_completion.d/tine\n" +
			"  tine completion zsh > \"${fpath[1]}/_tine\"\n" +
			"  tine completion fish > ~/.config/fish/completions/tine.fish",
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args:      nArgs("SHELL"),
		RunE: func(c *cobra.Command, args []string) error {
			root := c.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(a.stdout, true)
			case "zsh":
				return root.GenZshCompletion(a.stdout)
			case "fish":
				return root.GenFishCompletion(a.stdout, true)
			}
			return usageErr("completion: unknown shell %q (want bash, zsh or fish)", args[0])
		},
	}
}
