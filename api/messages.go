package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"tine/sandbox"
)

// Messages between sandboxes, and from the host (docs/api.md, "Messages").
// Inside a sandbox: POST /v1/messages sends, GET /v1/messages reads its
// own inbox; the sender is the socket the request came in on. The
// daemon's API: POST and GET /v1/sandboxes/{name}/messages send from the
// host and read a sandbox's inbox.

// MessageRequest is the body of POST /v1/messages inside a sandbox and of
// POST /v1/sandboxes/{name}/messages.
type MessageRequest struct {
	// To names the sandbox to message (inside a sandbox: required; on the
	// daemon's API: the path's, which it may repeat).
	To string `json:"to,omitempty"`
	// Body is any JSON value but null, at most 64 KiB compacted.
	Body json.RawMessage `json:"body"`
}

// Message is a message in an inbox (GET .../messages).
type Message = sandbox.Message

// MessageSent answers a message sent: what the audit log records of it.
type MessageSent struct {
	ID   uint64    `json:"id"`
	From string    `json:"from"`
	To   string    `json:"to"`
	Time time.Time `json:"time"`
	// Bytes and SHA256 are the size and hash of the body as stored
	// (compacted JSON).
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// senderFields are names a request might give a sender under; the sender
// is never the request's to say.
var senderFields = []string{"from", "sender"}

// decodeMessageRequest decodes and checks a message request's body.
func decodeMessageRequest(b []byte) (*MessageRequest, error) {
	var probe map[string]json.RawMessage
	if json.Unmarshal(b, &probe) == nil {
		for k := range probe {
			for _, f := range senderFields {
				if strings.EqualFold(k, f) {
					return nil, badRequest("field %q: the sender of a message is the sandbox whose socket it came in on (or the host), never the request's to say; leave it out", k)
				}
			}
		}
	}
	var req MessageRequest
	if err := decodeJSON(b, &req); err != nil {
		return nil, err
	}
	if req.To != "" && !validName(req.To) {
		return nil, badRequest("field \"to\" %q: want a sandbox name, 1-63 of [A-Za-z0-9._-] starting with a letter or digit", req.To)
	}
	if len(req.Body) == 0 {
		return nil, badRequest("field \"body\" is missing: give the message as any JSON value, such as \"hello\" or {\"task\":1}")
	}
	return &req, nil
}

// readMessageRequest reads a message request, or answers 400 or 413.
func readMessageRequest(w http.ResponseWriter, r *http.Request) (*MessageRequest, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		writeError(w, &Error{Code: "too_large", Message: fmt.Sprintf("message request exceeds %d bytes; a body may hold at most %d", MaxRequestBytes, sandbox.MaxMessageBytes)})
		return nil, false
	}
	var req *MessageRequest
	if err == nil {
		req, err = decodeMessageRequest(b)
	}
	if err != nil {
		writeError(w, err)
		return nil, false
	}
	return req, true
}

// writeMessageError answers a failed send or read: 404 (identical for a
// sandbox not allowed and one that does not exist), 413, 429 (the
// target's inbox is full), 400.
func writeMessageError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, sandbox.ErrInboxFull):
		writeJSON(w, http.StatusTooManyRequests, &Error{Code: "full", Message: err.Error()})
	case errors.Is(err, sandbox.ErrMessageTooLarge):
		writeError(w, &Error{Code: "too_large", Message: err.Error()})
	case errors.Is(err, sandbox.ErrBadMessage):
		writeError(w, badRequest("field \"body\": %v", err))
	default:
		writeError(w, err)
	}
}

// sent is what answers a message sent.
func sent(msg *Message) *MessageSent {
	sum := sha256.Sum256(msg.Body)
	return &MessageSent{ID: msg.ID, From: msg.From, To: msg.To, Time: msg.Time, Bytes: len(msg.Body), SHA256: hex.EncodeToString(sum[:])}
}

// readOptions parses GET .../messages's query: wait (a duration such as
// 30s, or seconds), take (true or false) and after (an ID).
func readOptions(r *http.Request) (sandbox.ReadOptions, error) {
	var o sandbox.ReadOptions
	q := r.URL.Query()
	if s := q.Get("wait"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			n, nerr := strconv.ParseUint(s, 10, 16)
			if nerr != nil {
				return o, badRequest("query \"wait\" %q: want a duration such as 30s or 2m, or seconds", s)
			}
			d = time.Duration(n) * time.Second
		}
		if d < 0 || d > sandbox.MaxMessageWait {
			return o, badRequest("query \"wait\" %q: want 0 to %v", s, sandbox.MaxMessageWait)
		}
		o.Wait = d
	}
	if s := q.Get("take"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return o, badRequest("query \"take\" %q: want true or false", s)
		}
		o.Take = b
	}
	if s := q.Get("after"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return o, badRequest("query \"after\" %q: want a message id, a whole number", s)
		}
		o.After = n
	}
	return o, nil
}

// send sends a message from the asking sandbox.
func (h *insideHandler) send(w http.ResponseWriter, r *http.Request) {
	req, ok := readMessageRequest(w, r)
	if !ok {
		return
	}
	if req.To == "" {
		writeError(w, badRequest("field \"to\" is missing: name the sandbox to message (its parent, a sibling or one of its forks, as its policy allows)"))
		return
	}
	msg, err := h.in.m.SendMessage(r.Context(), h.self, req.To, req.Body)
	if err != nil {
		writeMessageError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, sent(msg))
}

// maxInboxReads bounds the reads of one sandbox's inbox in progress at
// once, waiting or writing their answer: each may hold the inbox (up to
// 4 MiB) in memory until the sandbox reads it.
const maxInboxReads = 4

// inboxReads counts the reads in progress of each sandbox's inbox.
type inboxReads struct {
	mu sync.Mutex
	n  map[string]int
}

// acquire counts a read of name's inbox, unless maxInboxReads are in
// progress; release ends it.
func (ir *inboxReads) acquire(name string) (release func(), ok bool) {
	ir.mu.Lock()
	defer ir.mu.Unlock()
	if ir.n == nil {
		ir.n = map[string]int{}
	}
	if ir.n[name] >= maxInboxReads {
		return nil, false
	}
	ir.n[name]++
	return func() {
		ir.mu.Lock()
		defer ir.mu.Unlock()
		if ir.n[name]--; ir.n[name] <= 0 {
			delete(ir.n, name)
		}
	}, true
}

// receive reads the asking sandbox's inbox, waiting when asked.
func (h *insideHandler) receive(w http.ResponseWriter, r *http.Request) {
	o, err := readOptions(r)
	if err != nil {
		writeError(w, err)
		return
	}
	release, ok := h.in.reads.acquire(h.self)
	if !ok {
		writeJSON(w, http.StatusTooManyRequests, &Error{Code: "busy", Message: fmt.Sprintf("sandbox %q has %d reads of its inbox in progress, the most at once; wait for one to end", h.self, maxInboxReads)})
		return
	}
	defer release()
	msgs, err := h.in.m.Messages(r.Context(), h.self, o)
	if err != nil {
		writeMessageError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, msgs)
}

// sendMessage sends a message from the host to the path's sandbox.
func (s *Server) sendMessage(w http.ResponseWriter, r *http.Request) {
	name, ok := pathName(w, r)
	if !ok {
		return
	}
	req, ok := readMessageRequest(w, r)
	if !ok {
		return
	}
	if req.To != "" && req.To != name {
		writeError(w, badRequest("field \"to\" %q differs from the path's sandbox %q: leave it out", req.To, name))
		return
	}
	msg, err := s.m.SendHostMessage(r.Context(), name, req.Body)
	if err != nil {
		writeMessageError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, sent(msg))
}

// messages reads the path's sandbox's inbox, waiting when asked.
func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	name, ok := pathName(w, r)
	if !ok {
		return
	}
	o, err := readOptions(r)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := s.context(r)
	defer cancel()
	msgs, err := s.m.Messages(ctx, name, o)
	if err != nil {
		writeMessageError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, msgs)
}
