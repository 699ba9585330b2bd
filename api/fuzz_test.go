package api

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzRequestBody: whatever a client sends as a JSON body, decoding and
// checking it return an error or a request that passes its checks; they
// never panic.
func FuzzRequestBody(f *testing.F) {
	for _, s := range []string{
		`{"from":"/home/p","name":"a","env":["A=1"],"services":["make run"],"limits":{"pids":10}}`,
		`{"n":2,"names":["x","y"]}`, `{"n":-1}`, `{"names":["a","a"]}`,
		`{"argv":["sh","-c","true"],"tty":true,"rows":24,"cols":80,"timeout":1000000}`,
		`{"args":["/x"],"opts":{"root":"/r"},"json":true}`, `{"from":"snap-1:label"}`,
		`{"snapshot":"s"}`, `{"dry_run":true}`, `{} {}`, `{"from":`, `[]`, `null`, "",
		`{"argv":["a\u0000b"]}`, `{"timeout":-5}`, `{"from":"x","unknown":1}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		b := []byte(body)
		var c CreateRequest
		if decodeJSON(b, &c) == nil && c.validate() == nil {
			if c.From == "" || (c.Name != "" && !validName(c.Name)) {
				t.Fatalf("create passed its checks: %+v", c)
			}
		}
		var fk ForkRequest
		if decodeJSON(b, &fk) == nil && fk.validate() == nil {
			if fk.N < 1 || fk.N > MaxForks || len(fk.Names) > 0 && len(fk.Names) != fk.N {
				t.Fatalf("fork passed its checks: %+v", fk)
			}
		}
		var e ExecRequest
		if decodeJSON(b, &e) == nil && e.validate() == nil {
			if len(e.Argv) == 0 || e.Timeout < 0 || strings.Contains(strings.Join(e.Argv, ""), "\x00") {
				t.Fatalf("exec passed its checks: %+v", e)
			}
		}
		var fs FSRequest
		if decodeJSON(b, &fs) == nil {
			fs.validate()
		}
		for _, v := range []any{&SnapshotRequest{}, &RollbackRequest{}, &PromoteRequest{}} {
			decodeJSON(b, v)
		}
	})
}

// FuzzExecInput: an interactive exec's client messages decode to a valid
// input or an error, never a panic.
func FuzzExecInput(f *testing.F) {
	for _, s := range []string{
		`{"stdin":"aGVsbG8K"}`, `{"close_stdin":true}`, `{"resize":{"rows":40,"cols":100}}`,
		`{"signal":{"signal":15,"group":true}}`, `{"resize":{"rows":0,"cols":1}}`,
		`{"signal":{"signal":999}}`, `{"stdin":"!!"}`, `{"other":1}`, ``, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		in, err := decodeInput(msg)
		if err != nil {
			return
		}
		if in.Resize != nil && (in.Resize.Rows == 0 || in.Resize.Cols == 0) {
			t.Fatalf("a zero resize passed: %+v", in.Resize)
		}
		if in.Signal != nil && (in.Signal.Signal < 1 || in.Signal.Signal > 64) {
			t.Fatalf("signal %d passed", in.Signal.Signal)
		}
	})
}

// FuzzBytesField: BytesField's short way agrees with encoding/json on
// any message it accepts, and accepts every output, stderr and stdin
// message encoding/json writes, whatever the bytes.
func FuzzBytesField(f *testing.F) {
	for _, s := range []string{
		`{"stdout":"aGkK"}`, `{"stderr":""}`, `{"stdin":"aGVsbG8K"}`, `{"stdout":"aGk\nK"}`,
		`{"stdout":"aGk\u004b"}`, `{"stdout":"a\rGkK"}`, `{"stdout":"aGkK"} `, `{"stdout":"aGkK","exit":{}}`,
		`{"stdout":"!!"}`, `{"stdout":"aGk="}`, `{"stdout":"aGk"}`, `{"stdout" :"aGkK"}`, ``,
	} {
		f.Add([]byte(s), []byte(s))
	}
	f.Fuzz(func(t *testing.T, msg, data []byte) {
		for _, key := range []string{"stdout", "stderr", "stdin"} {
			if b, ok := BytesField(msg, key); ok {
				var m map[string][]byte
				if err := json.Unmarshal(msg, &m); err != nil {
					t.Fatalf("BytesField took %q as %s, encoding/json refuses it: %v", msg, key, err)
				}
				if len(m) != 1 || !bytes.Equal(m[key], b) {
					t.Fatalf("BytesField read %q as %s=%q, encoding/json as %q", msg, key, b, m)
				}
			}
		}
		for _, v := range []any{ExecEvent{Stdout: data}, ExecEvent{Stderr: data}, ExecInput{Stdin: data}} {
			msg, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			key := "stdout"
			switch x := v.(type) {
			case ExecEvent:
				if x.Stderr != nil {
					key = "stderr"
				}
			case ExecInput:
				key = "stdin"
			}
			if len(data) == 0 {
				continue // omitted: {}
			}
			b, ok := BytesField(msg, key)
			if !ok || !bytes.Equal(b, data) {
				t.Fatalf("BytesField(%q, %s) = %q, %v; want the %d bytes encoded", msg, key, b, ok, len(data))
			}
		}
	})
}
