package main

import (
	"context"
	"fmt"
	"io"
)

func init() {
	register(command{name: "demo", summary: "show tine at work on embedded defaults", run: runDemo})
}

func runDemo(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("demo")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "tine demo: the store is not built yet")
	return nil
}
