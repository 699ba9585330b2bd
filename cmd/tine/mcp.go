package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"tine/mcp"
)

func (a *app) mcpCommand() *cobra.Command {
	var addr string
	var all bool
	c := &cobra.Command{
		Use:   "mcp",
		Short: "serve tine's tools to an agent over the Model Context Protocol (stdio, or streamable HTTP with --http)",
		Long: "mcp speaks MCP on stdin/stdout (the way agent harnesses start tools), or with\n" +
			"--http ADDR over streamable HTTP at http://ADDR/, where every request must carry\n" +
			"\"Authorization: Bearer TOKEN\" (TOKEN from $TINE_MCP_TOKEN, or generated and printed\n" +
			"on stderr). A session sees only the sandboxes it created and their forks, unless\n" +
			"--all. See docs/mcp.md.",
		Args: nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := c.Context()
			cl, err := a.daemon(ctx)
			if err != nil {
				return err
			}
			o := mcp.Options{Client: cl, All: all, Version: version}
			if addr == "" {
				err := mcp.New(o).Run(ctx, &sdk.StdioTransport{})
				if errors.Is(err, context.Canceled) {
					return nil
				}
				return err
			}
			return a.serveMCP(ctx, o, addr)
		},
	}
	c.Flags().StringVar(&addr, "http", "", "serve streamable HTTP on this address (e.g. 127.0.0.1:8765) instead of stdio")
	c.Flags().BoolVar(&all, "all", false, "let sessions see and act on every sandbox of the daemon")
	return c
}

// serveMCP serves MCP over streamable HTTP on addr until ctx ends.
func (a *app) serveMCP(ctx context.Context, o mcp.Options, addr string) error {
	token := os.Getenv("TINE_MCP_TOKEN")
	if token == "" {
		var b [16]byte
		rand.Read(b[:])
		token = hex.EncodeToString(b[:])
		fmt.Fprintf(a.stderr, "tine mcp: token %s (set TINE_MCP_TOKEN to choose it)\n", token)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("tine mcp --http %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mcp.Handler(o, token), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(a.stderr, "tine mcp: serving MCP on http://%s/\n", ln.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	case err := <-served:
		return err
	}
}
