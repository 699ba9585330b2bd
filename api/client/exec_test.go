package client

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"tine/api"
	"tine/guestagent/proto"
)

// TestExecTooLarge: a command whose arguments pass the API's request
// bound is refused by the client with a bad_request error that gives the
// size and the bound and names the command by its program alone, not
// with the daemon's closed stream and the whole argv in the message.
func TestExecTooLarge(t *testing.T) {
	c := New(filepath.Join(t.TempDir(), "no-daemon.sock"))
	argv := []string{"sh", "-c", "echo $#"}
	for range 4000 {
		argv = append(argv, strings.Repeat("a", 300))
	}
	_, err := c.Exec(context.Background(), "sb", api.ExecRequest{ExecRequest: proto.ExecRequest{Argv: argv}}, ExecIO{})
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != "bad_request" {
		t.Fatalf("exec of %d arguments: %v, want a bad_request error", len(argv), err)
	}
	if msg := ce.Error(); len(msg) > 400 || !strings.Contains(msg, `"sh" with 4002 arguments`) || !strings.Contains(msg, "1048576") {
		t.Fatalf("the error: %s", msg)
	}
}
