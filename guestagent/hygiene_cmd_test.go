package guestagent

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tine/guestagent/client"
	"tine/guestagent/proto"
)

// TestHygieneRefusedOutsideVM: an agent that does not own its kernel (the
// ns runtime's) refuses a hygiene request, so that no sandbox host can be
// told to set the host's clock or feed the host's RNG through it.
func TestHygieneRefusedOutsideVM(t *testing.T) {
	c, _ := startAgent(t)
	err := c.Hygiene(ctxT(t), proto.HygieneRequest{Entropy: []byte{1}, Now: time.Now(), Generation: 1})
	if err == nil || !strings.Contains(err.Error(), "not in a VM") {
		t.Fatalf("hygiene on an ns agent: %v", err)
	}
}

// TestHygieneOversizedEntropy: an agent that takes hygiene requests
// refuses one with more entropy than MaxHygieneEntropy before applying
// anything, and the connection goes on.
func TestHygieneOversizedEntropy(t *testing.T) {
	a, err := New(Config{Root: t.TempDir(), Hygiene: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	sock := filepath.Join(t.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go a.Serve(l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Hygiene(ctx, proto.HygieneRequest{Entropy: make([]byte, proto.MaxHygieneEntropy+1)})
	if err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("oversized hygiene request: %v", err)
	}
	if _, err := c.Ps(ctx); err != nil {
		t.Fatalf("the connection did not survive the refusal: %v", err)
	}
}
