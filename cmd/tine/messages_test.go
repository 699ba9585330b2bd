package main

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"tine/api"
)

// TestMessagesCLI: tine send from the host (text, stdin, --raw), a
// message from inside a fork, tine messages (text with control
// characters escaped, --json, --take, -f), --message-to on create and in
// tine status.
func TestMessagesCLI(t *testing.T) {
	c, proj := newSandboxCLI(t)

	c.ok("create", "--from", proj, "--name", "a")
	c.ok("fork", "a", "-n", "1")
	if out := c.ok("status", "a-1"); !strings.Contains(out, "messages   to family") {
		t.Errorf("status: %s", out)
	}
	if out := c.ok("send", "a", "hello"); strings.TrimSpace(out) != "1" {
		t.Errorf("send: %q, want the id 1", out)
	}
	if out, errOut, code := c.run("from stdin\n\x1b[31mred", "send", "a", "-"); code != 0 {
		t.Fatalf("send -: %d %s %s", code, out, errOut)
	}
	var sent api.MessageSent
	if err := json.Unmarshal([]byte(c.ok("send", "a", "--raw", `{"n": 3}`, "--json")), &sent); err != nil || sent.ID != 3 || sent.From != "host" || sent.Bytes != 7 || len(sent.SHA256) != 64 {
		t.Errorf("send --raw --json: %+v %v", sent, err)
	}
	c.ok("exec", "a-1", "--", "curl", "-sS", "--unix-socket", api.InsideSocket, "-d", `{"to":"a","body":"from the fork"}`, "http://tine/v1/messages")

	out := c.ok("messages", "a")
	for _, want := range []string{"host", "hello", `from stdin\u000a\u001b[31mred`, `{"n":3}`, "a-1", "from the fork"} {
		if !strings.Contains(out, want) {
			t.Errorf("messages: no %q in\n%s", want, out)
		}
	}
	if strings.ContainsRune(out, 0x1b) {
		t.Errorf("messages printed an escape character")
	}
	var msgs []api.Message
	if err := json.Unmarshal([]byte(c.ok("messages", "a", "--json", "--take")), &msgs); err != nil || len(msgs) != 4 || msgs[3].From != "a-1" {
		t.Fatalf("messages --json --take: %+v %v", msgs, err)
	}
	if out := c.ok("messages", "a", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("after --take: %s", out)
	}

	// -f prints each message as it comes.
	cmd := exec.Command(tineBin, "--root", c.root, "messages", "a", "-f", "--json")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 2)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	time.Sleep(500 * time.Millisecond)
	c.ok("send", "a", "while you wait")
	select {
	case l := <-lines:
		var m api.Message
		if err := json.Unmarshal([]byte(l), &m); err != nil || string(m.Body) != `"while you wait"` || m.ID != 5 {
			t.Errorf("messages -f: %s %v", l, err)
		}
	case <-time.After(20 * time.Second):
		t.Error("messages -f printed nothing")
	}

	// --message-to.
	c.ok("create", "--from", proj, "--name", "n", "--message-to", "none")
	if out := c.ok("status", "n"); !strings.Contains(out, "messages   to none") {
		t.Errorf("status of n: %s", out)
	}
	if _, errOut, code := c.run("", "create", "--from", proj, "--name", "bad", "--message-to", "none,family"); code != 2 || !strings.Contains(errOut, "message_to") {
		t.Errorf("bad --message-to: exit %d %s", code, errOut)
	}
	if _, errOut, code := c.run("", "send", "nosuch", "x"); code != 1 || !strings.Contains(errOut, `"nosuch" not found`) {
		t.Errorf("send to a missing sandbox: exit %d %s", code, errOut)
	}
}
