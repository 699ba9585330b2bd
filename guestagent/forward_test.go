package guestagent

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestForwardUnix: HTTP requests to the forwarded socket reach the
// server behind dial and its answers come back; the socket is mode
// 0666; a failing dial closes the client's connection.
func TestForwardUnix(t *testing.T) {
	dir := t.TempDir()
	up := filepath.Join(dir, "up.sock")
	ul, err := net.Listen("unix", up)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.Method+" "+r.URL.Path+" "+string(b))
	})}
	go srv.Serve(ul)
	defer srv.Close()

	path := filepath.Join(dir, "run", "api.sock")
	l, err := ForwardUnix(path, func() (net.Conn, error) { return net.Dial("unix", up) })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o666 || st.Mode().Type() != os.ModeSocket {
		t.Fatalf("forwarded socket: %v %v", st.Mode(), err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}, Timeout: 10 * time.Second}
	for i := range 3 {
		resp, err := hc.Post("http://api/v1/ask", "text/plain", strings.NewReader(strings.Repeat("x", i*100000)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := "POST /v1/ask " + strings.Repeat("x", i*100000); string(b) != want {
			t.Fatalf("answer of %d bytes, want %d", len(b), len(want))
		}
	}

	bad := filepath.Join(dir, "bad.sock")
	bl, err := ForwardUnix(bad, func() (net.Conn, error) { return nil, errors.New("no host") })
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Close()
	c, err := net.Dial("unix", bad)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read on a connection whose dial failed: %d %v", n, err)
	}
}
