package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"tine/dashboard"
)

// serveDashboard serves the dashboard and the API on a TCP address behind
// a token ($TINE_DASHBOARD_TOKEN, or generated and printed); the returned
// function stops it.
func (a *app) serveDashboard(addr string, api http.Handler) (func(), error) {
	token := os.Getenv("TINE_DASHBOARD_TOKEN")
	if token == "" {
		var b [16]byte
		rand.Read(b[:])
		token = hex.EncodeToString(b[:])
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tine serve --dashboard %s: %w", addr, err)
	}
	srv := &http.Server{Handler: dashboard.Handler(api, token), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	fmt.Fprintf(a.stderr, "tine serve: dashboard at http://%s/?token=%s\n", ln.Addr(), token)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}
