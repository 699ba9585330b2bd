package proto

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := []Frame{{Kind: KindHello, Payload: []byte(`{"x":1}`)}, {Kind: KindStdout, ID: 7, Payload: []byte("out")}, {Kind: KindEnd, ID: 1 << 31}}
	for _, f := range in {
		if err := WriteFrame(&buf, f); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range in {
		got, err := ReadFrame(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if got.Kind != want.Kind || got.ID != want.ID || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("got %+v, want %+v", got, want)
		}
	}
	if _, err := ReadFrame(&buf); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

// TestReadFrameRefusesBeforeAllocating: a header announcing 4 GiB is refused
// from the header alone, without reading or allocating the payload.
func TestReadFrameRefusesBeforeAllocating(t *testing.T) {
	hdr := []byte{0xff, 0xff, 0xff, 0xff, byte(KindStdout), 0, 0, 0, 1}
	_, err := ReadFrame(bytes.NewReader(hdr))
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("4 GiB frame: %v, want ErrFrameTooLarge", err)
	}
	if _, err := AppendFrame(nil, Frame{Kind: KindData, Payload: make([]byte, MaxPayload+1)}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("encode oversize: %v", err)
	}
	for _, k := range []byte{0, byte(kindLimit), 0xff} {
		_, err := ReadFrame(bytes.NewReader([]byte{0, 0, 0, 0, k, 0, 0, 0, 1}))
		if err == nil || !strings.Contains(err.Error(), "unknown kind") {
			t.Fatalf("kind %d: %v", k, err)
		}
	}
	// A frame cut short is an error, not a clean end.
	if _, err := ReadFrame(bytes.NewReader([]byte{0, 0, 0, 5, byte(KindData), 0, 0, 0, 1, 'a'})); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short payload: %v", err)
	}
	if _, err := ReadFrame(bytes.NewReader([]byte{0, 0})); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short header: %v", err)
	}
}

func TestCheckHello(t *testing.T) {
	if err := CheckHello(HelloFrame()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		f    Frame
		want string
	}{
		{mustJSON(KindHello, Hello{Magic: Magic, Version: Version + 1}), "version 2"},
		{mustJSON(KindHello, Hello{Magic: "other", Version: Version}), "magic"},
		{mustJSON(KindError, Error{Message: "no"}), "refused the handshake: no"},
		{Frame{Kind: KindPs}, "want hello"},
		{Frame{Kind: KindHello, Payload: []byte("{")}, "decode"},
	} {
		if err := CheckHello(tc.f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %q: %v, want %q", tc.f.Kind, tc.f.Payload, err, tc.want)
		}
	}
}

// TestErrorCode: an Error's code is optional both ways: an older agent's
// error (no code) decodes with none, an error without a code encodes as
// before, and each exec code has the exit status a shell gives.
func TestErrorCode(t *testing.T) {
	var e Error
	if err := Decode(Frame{Kind: KindError, Payload: []byte(`{"message":"exec [\"x\"]: x: not found in PATH /bin"}`)}, &e); err != nil || e.Code != "" || e.Message == "" {
		t.Fatalf("an older agent's error: %+v, %v", e, err)
	}
	if f := mustJSON(KindError, Error{Message: "m"}); string(f.Payload) != `{"message":"m"}` {
		t.Fatalf("an error without a code encodes as %s", f.Payload)
	}
	in := Error{Message: "x: command not found", Code: CodeNotFound}
	var out Error
	if err := Decode(mustJSON(KindError, in), &out); err != nil || out != in {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
	for code, want := range map[string]int{CodeNotFound: 127, CodeNotExecutable: 126, CodeBadDir: 126, "": 0, "other": 0} {
		if got := ExecExitStatus(code); got != want {
			t.Errorf("ExecExitStatus(%q) = %d, want %d", code, got, want)
		}
	}
}

func mustJSON(k Kind, v any) Frame {
	f, err := JSONFrame(k, 0, v)
	if err != nil {
		panic(err)
	}
	return f
}

// FuzzReadFrame: arbitrary bytes never panic, never yield a payload over
// the bound, and a frame that decodes re-encodes to the bytes it came from.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, byte(KindStdout), 0, 0, 0, 9, 'a', 'b', 'c'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0})
	hello, _ := AppendFrame(nil, HelloFrame())
	f.Add(hello)
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			start := len(b) - r.Len()
			fr, err := ReadFrame(r)
			if err != nil {
				return
			}
			if len(fr.Payload) > MaxPayload {
				t.Fatalf("payload %d over the bound", len(fr.Payload))
			}
			enc, err := AppendFrame(nil, fr)
			if err != nil {
				t.Fatal(err)
			}
			if end := len(b) - r.Len(); !bytes.Equal(enc, b[start:end]) {
				t.Fatalf("re-encoding differs: %x vs %x", enc, b[start:end])
			}
		}
	})
}

// FuzzFrameRoundTrip: every frame that encodes decodes to itself.
func FuzzFrameRoundTrip(f *testing.F) {
	f.Add(uint8(KindData), uint32(3), []byte("chunk"))
	f.Fuzz(func(t *testing.T, kind uint8, id uint32, payload []byte) {
		in := Frame{Kind: Kind(kind), ID: id, Payload: payload}
		var buf bytes.Buffer
		if err := WriteFrame(&buf, in); err != nil {
			return
		}
		out, err := ReadFrame(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if out.Kind != in.Kind || out.ID != in.ID || !bytes.Equal(out.Payload, in.Payload) {
			t.Fatalf("got %+v, want %+v", out, in)
		}
	})
}

// FuzzDecodeMessages: any payload decodes into every message type without
// panicking, and a message that decodes survives encode -> decode.
func FuzzDecodeMessages(f *testing.F) {
	for _, v := range []any{ExecRequest{Argv: []string{"sh"}, TTY: true, Rows: 3}, Process{PID: 1, Argv: []string{"a"}},
		Port{Proto: "tcp", Port: 80}, Event{Type: EventLost, Lost: 3}, Exit{Code: -1, Signal: 9}, FileInfo{Mode: 0o755, Size: 3},
		HygieneRequest{Entropy: []byte{1, 2, 3}, Generation: 7}, Error{Message: "x: command not found", Code: CodeNotFound},
		Error{Message: "old agent"}} {
		b, _ := json.Marshal(v)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		news := []func() any{
			func() any { return new(Hello) }, func() any { return new(Error) }, func() any { return new(ExecRequest) },
			func() any { return new(Started) }, func() any { return new(Exit) }, func() any { return new(Signal) },
			func() any { return new(Resize) }, func() any { return new(PutRequest) }, func() any { return new(GetRequest) },
			func() any { return new(FileInfo) }, func() any { return new(Process) }, func() any { return new(Port) },
			func() any { return new(Event) }, func() any { return new(HygieneRequest) },
		}
		for _, mk := range news {
			v := mk()
			if Decode(Frame{Kind: KindItem, Payload: b}, v) != nil {
				continue
			}
			fr, err := JSONFrame(KindItem, 1, v)
			if err != nil {
				continue // re-encoding may exceed the frame bound
			}
			w := mk()
			if err := Decode(fr, w); err != nil {
				t.Fatalf("%T: re-decode of %s: %v", v, fr.Payload, err)
			}
			again, _ := JSONFrame(KindItem, 1, w)
			if !bytes.Equal(again.Payload, fr.Payload) {
				t.Fatalf("%T: %s != %s", v, again.Payload, fr.Payload)
			}
		}
	})
}

// FuzzHygieneRequest: any payload either fails to decode, is refused by
// Check, or holds at most MaxHygieneEntropy bytes of entropy.
func FuzzHygieneRequest(f *testing.F) {
	f.Add([]byte(`{"entropy":"AQID","now":"2026-01-02T03:04:05Z","generation":3}`))
	f.Add([]byte(`{"entropy":null,"generation":18446744073709551615}`))
	f.Add([]byte(`{"now":"0001-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"generation":4,"net":{"interface":"eth0","mac":"02:00:00:00:00:01","address":"10.214.0.2/30","gateway":"10.214.0.1"}}`))
	f.Add([]byte(`{"net":{"interface":"../x","mac":"01:00:5e:00:00:01","address":"10.214.0.0/30","gateway":"10.214.0.5"}}`))
	f.Add([]byte(`{"net":{"interface":"eth0","mac":"02:00:00:00:00:01:02:03","address":"fe80::1/64","gateway":"fe80::2"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h HygieneRequest
		if Decode(Frame{Kind: KindHygiene, Payload: b}, &h) != nil {
			return
		}
		if h.Check() == nil && len(h.Entropy) > MaxHygieneEntropy {
			t.Fatalf("Check passed %d bytes of entropy", len(h.Entropy))
		}
		if h.Check() == nil && h.Net != nil {
			name, mac, addr, gw, err := h.Net.Parse()
			if err != nil || len(name) > 15 || strings.Contains(name, "/") || len(mac) != 6 || mac[0]&1 != 0 ||
				!addr.Addr().Is4() || !gw.Is4() || !addr.Masked().Contains(gw) || gw == addr.Addr() {
				t.Fatalf("Check passed the network identity %+v: %q %s %s %s %v", *h.Net, name, mac, addr, gw, err)
			}
		}
	})
}
