package client

import (
	"bytes"
	"testing"
)

// FuzzExecEvents: whatever the daemon streams, the client reads bounded
// lines and decodes events or stops with an error; it never panics and
// never holds a line longer than maxEventBytes.
func FuzzExecEvents(f *testing.F) {
	for _, s := range []string{
		"{\"started\":{\"pid\":3}}\n{\"stdout\":\"aGkK\"}\n{\"stderr\":\"b29wcwo=\"}\n{\"exit\":{\"pid\":3,\"code\":1}}\n",
		"{\"error\":{\"code\":\"not_found\",\"message\":\"sandbox \\\"x\\\": not found\"}}\n",
		"{\"error\":{\"code\":\"command_not_found\",\"message\":\"x: command not found\",\"exit_code\":127}}\n",
		"{\"error\":{\"code\":\"bad_dir\",\"message\":\"d\",\"exit_code\":-300}}\n",
		"\n\n{\"exit\":{\"code\":0}}", "{\"stdout\":\"!!\"}\n", "{\"exit\":", "",
		"{\"type\":\"port-opened\",\"port\":{\"port\":80}}\n",
	} {
		f.Add([]byte(s))
	}
	f.Add(append(bytes.Repeat([]byte("x"), maxEventBytes+10), '\n'))
	f.Fuzz(func(t *testing.T, data []byte) {
		lr := newLineReader(bytes.NewReader(data))
		for range 1000 {
			line, err := lr.next()
			if err != nil {
				break
			}
			if len(line) > maxEventBytes {
				t.Fatalf("a line of %d bytes passed", len(line))
			}
			ev, err := decodeEvent(line)
			if err != nil {
				continue
			}
			var out bytes.Buffer
			_, done, err := deliver(ev, ExecIO{Stdout: &out, Stderr: &out})
			if done && err == nil && ev.Exit == nil {
				t.Fatalf("an event without exit ended the exec: %s", line)
			}
			if ce, ok := err.(*Error); ok && (ce.ExitCode < 0 || ce.ExitCode > 255) {
				t.Fatalf("an error's exit code %d passed: %s", ce.ExitCode, line)
			}
		}
		lr = newLineReader(bytes.NewReader(data))
		for range 1000 {
			if _, err := lr.event(); err != nil {
				break
			}
		}
	})
}
