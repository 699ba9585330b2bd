// Package proto is the wire protocol between the host and the guest agent:
// length-prefixed frames, each tagged with a kind and a request id, whose
// payloads are either raw bytes (process output, stdin, file chunks) or one
// JSON message. The first frame each side sends is a Hello carrying the
// protocol version; a side that does not speak that version says so in an
// Error frame and closes the connection.
package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol version this package speaks.
const Version = 1

// Magic identifies the protocol in a Hello message.
const Magic = "tine-guestagent"

// MaxPayload bounds the payload of every frame; a larger length is refused
// before anything is allocated.
const MaxPayload = 1 << 20

// ChunkSize is the size in which byte streams (output, stdin, files) are
// cut into frames.
const ChunkSize = 32 << 10

// MaxItemBytes bounds the payload of one Item or Event frame; a process's
// command line is cut to MaxArgvBytes, so real items are far smaller.
const MaxItemBytes = 16 << 10

// StdinWindow is how many Stdin frames the host sends before it waits for
// an Ack, so that a process that does not read its input stalls only its
// own stdin, never the connection.
const StdinWindow = 8

// HeaderLen is the size of a frame header: payload length (uint32, big
// endian), kind (one byte) and request id (uint32, big endian).
const HeaderLen = 9

// Kind says what a frame carries.
type Kind uint8

// Frame kinds. Host-to-agent requests start a stream with a new id; the
// agent's answers carry the same id.
const (
	KindHello      Kind = iota + 1 // JSON Hello, id 0, first frame of each side
	KindError                      // JSON Error: the request failed; ends its stream
	KindPs                         // host: list processes; answered by Item frames and End
	KindPorts                      // host: list listening sockets; answered by Item frames and End
	KindEvents                     // host: subscribe to events; answered by Event frames until Cancel
	KindExec                       // host: JSON ExecRequest; answered by Started, output, Exit
	KindStdin                      // host: bytes for the process's stdin
	KindCloseStdin                 // host: close the process's stdin
	KindSignal                     // host: JSON Signal for the process
	KindResize                     // host: JSON Resize of the process's terminal
	KindPut                        // host: JSON PutRequest, then Data frames and End; answered by End
	KindGet                        // host: JSON GetRequest; answered by FileInfo, Data frames and End
	KindCancel                     // host: stop the stream (kills an exec's process group)
	KindItem                       // agent: one JSON Process or Port of a list
	KindEnd                        // either: the stream's data is complete
	KindStarted                    // agent: JSON Started, the exec's process runs
	KindStdout                     // agent: bytes the process wrote to stdout (or its terminal)
	KindStderr                     // agent: bytes the process wrote to stderr
	KindExit                       // agent: JSON Exit; ends an exec stream
	KindEvent                      // agent: JSON Event
	KindData                       // either: a chunk of file content
	KindFileInfo                   // agent: JSON FileInfo before a Get's data
	KindAck                        // agent: one Stdin frame reached the process
	KindHygiene                    // host: JSON HygieneRequest after a fork or restore; answered by End
	KindPutTree                    // host: JSON PutTreeRequest, then a tar stream in Data frames and End; answered by End
	KindGetTree                    // host: JSON GetTreeRequest; answered by a tar stream in Data frames and End
	kindLimit
)

var kindNames = [...]string{"", "hello", "error", "ps", "ports", "events", "exec", "stdin", "close-stdin",
	"signal", "resize", "put", "get", "cancel", "item", "end", "started", "stdout", "stderr", "exit",
	"event", "data", "file-info", "ack", "hygiene", "put-tree", "get-tree"}

func (k Kind) String() string {
	if k > 0 && k < kindLimit {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Frame is one message on the wire.
type Frame struct {
	Kind    Kind
	ID      uint32
	Payload []byte
}

// ErrFrameTooLarge is returned for a frame whose payload exceeds MaxPayload.
var ErrFrameTooLarge = errors.New("guest agent frame payload exceeds the 1 MiB bound")

// AppendFrame appends the encoding of f to b.
func AppendFrame(b []byte, f Frame) ([]byte, error) {
	if len(f.Payload) > MaxPayload {
		return b, fmt.Errorf("encode %v frame %d (%d bytes): %w", f.Kind, f.ID, len(f.Payload), ErrFrameTooLarge)
	}
	if f.Kind == 0 || f.Kind >= kindLimit {
		return b, fmt.Errorf("encode frame %d: unknown kind %v", f.ID, f.Kind)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Payload)))
	b = append(b, byte(f.Kind))
	b = binary.BigEndian.AppendUint32(b, f.ID)
	return append(b, f.Payload...), nil
}

// WriteFrame writes f to w in one Write call, so that concurrent writers
// serialised by a mutex never interleave frames.
func WriteFrame(w io.Writer, f Frame) error {
	b, err := AppendFrame(make([]byte, 0, HeaderLen+len(f.Payload)), f)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// ReadFrame reads one frame from r. It allocates at most MaxPayload bytes,
// and only after the header has been checked; a short or invalid frame is an
// error (io.EOF only for a clean end between frames).
func ReadFrame(r io.Reader) (Frame, error) {
	var h [HeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return Frame{}, fmt.Errorf("read frame header: connection ended inside it: %w", err)
		}
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(h[0:4])
	f := Frame{Kind: Kind(h[4]), ID: binary.BigEndian.Uint32(h[5:9])}
	if n > MaxPayload {
		return Frame{}, fmt.Errorf("read %v frame %d of %d bytes: %w", f.Kind, f.ID, n, ErrFrameTooLarge)
	}
	if f.Kind == 0 || f.Kind >= kindLimit {
		return Frame{}, fmt.Errorf("read frame %d: unknown kind %v; the peer speaks another protocol", f.ID, f.Kind)
	}
	if n > 0 {
		f.Payload = make([]byte, n)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			return Frame{}, fmt.Errorf("read %v frame %d payload of %d bytes: %w", f.Kind, f.ID, n, noEOF(err))
		}
	}
	return f, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
