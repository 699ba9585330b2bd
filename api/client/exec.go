package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/coder/websocket"

	"tine/api"
	"tine/guestagent/proto"
)

// maxEventBytes bounds one ExecEvent or Event line from the daemon.
const maxEventBytes = 1 << 20

// stdinChunk is the most stdin bytes one ExecInput carries.
const stdinChunk = 32 << 10

// ExecIO connects an exec to the caller's streams. Stdin may be nil.
// Resize, when not nil, delivers window sizes for a TTY.
type ExecIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Resize         <-chan proto.Resize
	Signals        <-chan proto.Signal
}

// Exec runs a command in the sandbox, streams its output to io, and
// returns how it ended. With stdin, a TTY, resizes or signals it uses the
// interactive (WebSocket) endpoint. Ending ctx kills the command. A
// Stdin that blocks (a terminal) is left reading when Exec returns.
func (c *Client) Exec(ctx context.Context, name string, req api.ExecRequest, io ExecIO) (proto.Exit, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return proto.Exit{}, err
	}
	if len(b) > api.MaxRequestBytes {
		return proto.Exit{}, &Error{Status: 400, Code: "bad_request", Message: fmt.Sprintf(
			"exec %s in sandbox %q: the request (arguments and environment) is %d bytes, over the %d the API takes; pass large input on stdin or in a file",
			argvText(req.Argv), name, len(b), api.MaxRequestBytes)}
	}
	if io.Stdin != nil || req.TTY || io.Resize != nil || io.Signals != nil {
		return c.execWS(ctx, name, req, io)
	}
	resp, err := c.do(ctx, "POST", sandboxPath(name, "/exec"), bytes.NewReader(b), "application/json")
	if err != nil {
		return proto.Exit{}, err
	}
	defer resp.Body.Close()
	lr := newLineReader(resp.Body)
	for {
		ev, err := lr.event()
		if err != nil {
			return proto.Exit{}, fmt.Errorf("exec %s in sandbox %q: %w", argvText(req.Argv), name, err)
		}
		if ex, done, err := deliver(ev, io); done {
			return ex, err
		}
	}
}

// deliver writes an event's output to io; done says the event ended the
// exec (an exit or an error).
func deliver(ev api.ExecEvent, io ExecIO) (proto.Exit, bool, error) {
	switch {
	case ev.Stdout != nil && io.Stdout != nil:
		io.Stdout.Write(ev.Stdout)
	case ev.Stderr != nil && io.Stderr != nil:
		io.Stderr.Write(ev.Stderr)
	case ev.Exit != nil:
		return *ev.Exit, true, nil
	case ev.Error != nil:
		return proto.Exit{}, true, &Error{Code: ev.Error.Code, Message: ev.Error.Message, ExitCode: exitCode(ev.Error.ExitCode)}
	}
	return proto.Exit{}, false, nil
}

// lineReader reads newline-delimited JSON of bounded lines.
type lineReader struct{ r *bufio.Reader }

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{bufio.NewReaderSize(r, 64<<10)}
}

// next returns the next non-empty line, at most maxEventBytes long.
func (l *lineReader) next() ([]byte, error) {
	for {
		var line []byte
		for {
			frag, err := l.r.ReadSlice('\n')
			if len(line)+len(frag) > maxEventBytes {
				return nil, fmt.Errorf("a line of the daemon's stream exceeds %d bytes", maxEventBytes)
			}
			line = append(line, frag...)
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF && len(bytes.TrimSpace(line)) > 0 {
				return nil, io.ErrUnexpectedEOF // a cut line
			}
			if err != nil {
				return nil, err
			}
			break
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			return line, nil
		}
	}
}

// event returns the next ExecEvent; the stream must end with an exit or
// an error event, so its end before one is an error.
func (l *lineReader) event() (api.ExecEvent, error) {
	line, err := l.next()
	if err == io.EOF {
		err = errors.New("the daemon's stream ended before the command's exit")
	}
	if err != nil {
		return api.ExecEvent{}, err
	}
	return decodeEvent(line)
}

// decodeEvent decodes one ExecEvent message; output, nearly all of a
// busy stream, takes api.BytesField's short way.
func decodeEvent(b []byte) (api.ExecEvent, error) {
	var ev api.ExecEvent
	if out, ok := api.BytesField(b, "stdout"); ok {
		ev.Stdout = out
		return ev, nil
	}
	if out, ok := api.BytesField(b, "stderr"); ok {
		ev.Stderr = out
		return ev, nil
	}
	if err := json.Unmarshal(b, &ev); err != nil {
		return ev, fmt.Errorf("decode an exec event: %w", err)
	}
	return ev, nil
}

// execWS runs an exec over the interactive endpoint.
func (c *Client) execWS(ctx context.Context, name string, req api.ExecRequest, eio ExecIO) (proto.Exit, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fail := func(err error) (proto.Exit, error) {
		return proto.Exit{}, fmt.Errorf("exec %s in sandbox %q: %w", argvText(req.Argv), name, err)
	}
	u := "ws://tine/" + api.Version + sandboxPath(name, "/exec/ws")
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			// The body was read by Dial; the status tells what failed.
			return fail(&Error{Status: resp.StatusCode, Code: codeOfStatus(resp.StatusCode), Message: err.Error()})
		}
		return fail(err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxEventBytes)
	var wmu sync.Mutex
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		wmu.Lock()
		defer wmu.Unlock()
		return conn.Write(ctx, websocket.MessageText, b)
	}
	if err := send(req); err != nil {
		return fail(err)
	}
	if eio.Stdin != nil {
		go func() {
			buf := make([]byte, stdinChunk)
			for {
				n, err := eio.Stdin.Read(buf)
				if n > 0 && send(api.ExecInput{Stdin: buf[:n]}) != nil {
					return
				}
				if err != nil {
					send(api.ExecInput{CloseStdin: true})
					return
				}
			}
		}()
	}
	if eio.Resize != nil || eio.Signals != nil {
		go func() {
			for {
				select {
				case r, ok := <-eio.Resize:
					if !ok {
						eio.Resize = nil
						continue
					}
					send(api.ExecInput{Resize: &r})
				case s, ok := <-eio.Signals:
					if !ok {
						eio.Signals = nil
						continue
					}
					send(api.ExecInput{Signal: &s})
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	for {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			if s := websocket.CloseStatus(err); s != -1 {
				err = fmt.Errorf("the daemon closed the exec (%v) before the command's exit", s)
			}
			return fail(err)
		}
		ev, err := decodeEvent(msg)
		if err != nil {
			return fail(err)
		}
		if ex, done, err := deliver(ev, eio); done {
			if err != nil {
				return proto.Exit{}, err
			}
			conn.Close(websocket.StatusNormalClosure, "")
			return ex, nil
		}
	}
}

// codeOfStatus guesses an error code from a status when no body is known.
func codeOfStatus(status int) string {
	switch status {
	case 400:
		return "bad_request"
	case 403:
		return "denied"
	case 404:
		return "not_found"
	case 409:
		return "conflict"
	}
	return "internal"
}

// argvText names a command in an error: its program and how many
// arguments follow, not all of them (they may be a megabyte).
func argvText(argv []string) string {
	if len(argv) == 0 {
		return "(no command)"
	}
	if len(argv) == 1 {
		return fmt.Sprintf("%q", argv[0])
	}
	return fmt.Sprintf("%q with %d arguments", argv[0], len(argv)-1)
}
