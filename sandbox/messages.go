package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"tine/internal/atomicfile"
)

// Messages between sandboxes: each sandbox has an inbox, a file in its
// state directory (inbox.jsonl) that a message is appended to, and
// fsync'd, before its sender gets an answer. A sandbox may message the
// sandboxes its policy (Info.MessageTo) allows; the host may message any.
// See docs/api.md, "Messages", and docs/adr/0153.

// Bounds of messages and inboxes.
const (
	// MaxMessageBytes bounds a message's body (its JSON, compacted).
	MaxMessageBytes = 64 << 10
	// MaxInboxMessages and MaxInboxBytes bound what an inbox holds
	// (MaxInboxBytes counts the bodies).
	MaxInboxMessages = 256
	MaxInboxBytes    = 4 << 20
	// MaxMessageWait bounds how long a read of an inbox waits.
	MaxMessageWait = 5 * time.Minute
	// maxInboxFile bounds the inbox file that is read back: the bodies,
	// and each message's other fields and their JSON escaping.
	maxInboxFile = 2*MaxInboxBytes + MaxInboxMessages*1024
	// maxGlobs bounds the globs of a message policy.
	maxGlobs = 16
)

// HostSender is the sender of a message sent from the host. A sandbox
// named "host" cannot send messages, so no sandbox is taken for it.
const HostSender = "host"

// Errors of messages, for errors.Is.
var (
	// ErrMessageTooLarge reports a body over MaxMessageBytes.
	ErrMessageTooLarge = errors.New("message too large")
	// ErrInboxFull reports an inbox holding MaxInboxMessages or
	// MaxInboxBytes.
	ErrInboxFull = errors.New("inbox full")
	// ErrBadMessage reports a body that is not one JSON value.
	ErrBadMessage = errors.New("bad message")
)

// Message is one message in a sandbox's inbox.
type Message struct {
	// ID is unique in the inbox and grows with every message, across
	// takes and daemon restarts.
	ID uint64 `json:"id"`
	// From is the sending sandbox, or "host".
	From string `json:"from"`
	// To is the receiving sandbox.
	To   string    `json:"to"`
	Time time.Time `json:"time"`
	// Body is the JSON value the sender sent, compacted.
	Body json.RawMessage `json:"body"`
}

// MessagePolicy says which sandboxes a sandbox may message.
type MessagePolicy struct {
	// Family allows its parent, its siblings (forks of the same parent),
	// itself and its own forks at any depth.
	Family bool
	// Globs allow every sandbox whose name one of them matches
	// (path.Match).
	Globs []string
}

var globRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._*?\[\]^!-]{1,64}$`) })

// ParseMessagePolicy parses "family" (also ""), "none", or a
// comma-separated list of "family" and name globs, such as
// "family,worker-*".
func ParseMessagePolicy(s string) (MessagePolicy, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "family" {
		return MessagePolicy{Family: true}, nil
	}
	if s == "none" {
		return MessagePolicy{}, nil
	}
	var p MessagePolicy
	seen := map[string]bool{}
	for _, it := range strings.Split(s, ",") {
		it = strings.TrimSpace(it)
		switch {
		case it == "family":
			p.Family = true
		case it == "none":
			return MessagePolicy{}, fmt.Errorf("message policy %q: \"none\" stands alone", s)
		case !globRE().MatchString(it):
			return MessagePolicy{}, fmt.Errorf("message policy %q: %q is not family, none or a glob of sandbox names (1-64 of [A-Za-z0-9._-] and *?[]^!)", s, it)
		default:
			if _, err := path.Match(it, ""); err != nil {
				return MessagePolicy{}, fmt.Errorf("message policy %q: glob %q: %w", s, it, err)
			}
			if !seen[it] {
				seen[it] = true
				p.Globs = append(p.Globs, it)
			}
		}
	}
	if len(p.Globs) > maxGlobs {
		return MessagePolicy{}, fmt.Errorf("message policy %q: %d globs, at most %d", s, len(p.Globs), maxGlobs)
	}
	return p, nil
}

// String is the policy as ParseMessagePolicy reads it.
func (p MessagePolicy) String() string {
	var items []string
	if p.Family {
		items = append(items, "family")
	}
	items = append(items, p.Globs...)
	if len(items) == 0 {
		return "none"
	}
	return strings.Join(items, ",")
}

// initMessages sets a new sandbox's message policy: the one asked for,
// else its parent's, else family.
func (m *Manager) initMessages(info *Info, o CreateOptions, forkedFrom string) error {
	to := o.MessageTo
	if to == "" && forkedFrom != "" {
		if p, err := m.Get(forkedFrom); err == nil {
			to = p.MessageTo
		}
	}
	p, err := ParseMessagePolicy(to)
	if err != nil {
		return err
	}
	info.MessageTo = p.String()
	return nil
}

// mayMessage says whether sandbox from's policy lets it message to.
func (m *Manager) mayMessage(from *Info, to string) bool {
	p, err := ParseMessagePolicy(from.MessageTo)
	if err != nil {
		return false
	}
	for _, g := range p.Globs {
		if ok, _ := path.Match(g, to); ok {
			return true
		}
	}
	if !p.Family {
		return false
	}
	if to == from.Name || to == from.ForkedFrom || m.InTree(from.Name, to) {
		return true
	}
	if from.ForkedFrom == "" {
		return false
	}
	t, err := m.Get(to)
	return err == nil && t.ForkedFrom == from.ForkedFrom
}

// messaging is the Manager's per-inbox locks and the channels that wake
// the readers of an inbox when a message arrives.
type messaging struct {
	mu      sync.Mutex
	inboxes nameLocks
	changed map[string]chan struct{}
}

// lock locks sandbox name's inbox and returns its unlock.
func (ms *messaging) lock(name string) func() { return ms.inboxes.lock(name) }

// wait returns a channel closed at the next message to name.
func (ms *messaging) wait(name string) <-chan struct{} {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.changed == nil {
		ms.changed = map[string]chan struct{}{}
	}
	c := ms.changed[name]
	if c == nil {
		c = make(chan struct{})
		ms.changed[name] = c
	}
	return c
}

// wake wakes the readers of name's inbox.
func (ms *messaging) wake(name string) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if c := ms.changed[name]; c != nil {
		close(c)
		delete(ms.changed, name)
	}
}

func (m *Manager) inboxPath(name string) string { return filepath.Join(m.dir(name), "inbox.jsonl") }

// notFoundFor is the answer to a sandbox messaging one its policy does
// not allow, and to one messaging a sandbox that does not exist: the
// same, so that it tells nothing about what exists.
func notFoundFor(from, to string) error {
	return fmt.Errorf("message from sandbox %q to %q: no such sandbox that %q may message: %w", from, to, from, ErrNotFound)
}

// SendMessage appends a message from sandbox from to sandbox to's inbox,
// if from's policy allows it, and returns it once it is on disk. A
// target the policy does not allow is ErrNotFound, as one that does not
// exist.
func (m *Manager) SendMessage(ctx context.Context, from, to string, body []byte) (*Message, error) {
	if from == HostSender {
		return nil, fmt.Errorf("sandbox %q cannot send messages: the name marks messages from the host; give the sandbox another name: %w", from, ErrDenied)
	}
	fi, err := m.Get(from)
	if err != nil {
		return nil, err
	}
	if _, err := checkBody(body); err != nil {
		return nil, err
	}
	if !nameRE().MatchString(to) || !m.mayMessage(fi, to) {
		m.audit(from, "message_refused", map[string]any{"to": to, "reason": "not allowed by the sandbox's message policy or no such sandbox"})
		return nil, notFoundFor(from, to)
	}
	msg, err := m.deliver(from, to, body)
	if errors.Is(err, ErrNotFound) {
		err = notFoundFor(from, to)
	}
	if err != nil {
		if errors.Is(err, ErrInboxFull) || errors.Is(err, ErrMessageTooLarge) {
			m.audit(from, "message_refused", map[string]any{"to": to, "reason": err.Error(), "bytes": len(body)})
		}
		return nil, err
	}
	m.auditMessage(from, msg)
	return msg, nil
}

// SendHostMessage appends a message from the host to sandbox to's inbox
// and returns it once it is on disk.
func (m *Manager) SendHostMessage(ctx context.Context, to string, body []byte) (*Message, error) {
	if _, err := m.Get(to); err != nil {
		return nil, err
	}
	msg, err := m.deliver(HostSender, to, body)
	if errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("sandbox %q: %w", to, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	m.auditMessage(to, msg)
	return msg, nil
}

// auditMessage records a message in the log of sandbox name (and the
// daemon's): the body's hash and size, never the body.
func (m *Manager) auditMessage(name string, msg *Message) {
	sum := sha256.Sum256(msg.Body)
	m.audit(name, "message", map[string]any{"id": msg.ID, "from": msg.From, "to": msg.To,
		"sha256": hex.EncodeToString(sum[:]), "bytes": len(msg.Body)})
}

// checkBody returns body compacted, or why it cannot be a message. The
// bound is on the compacted body.
func checkBody(body []byte) ([]byte, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, body); err != nil || b.Len() == 0 {
		return nil, fmt.Errorf("message body is not one JSON value: %w", ErrBadMessage)
	}
	if b.Len() > MaxMessageBytes {
		return nil, fmt.Errorf("message body of %d bytes is over %d: %w; send a path or a smaller part", b.Len(), MaxMessageBytes, ErrMessageTooLarge)
	}
	if b.String() == "null" {
		return nil, fmt.Errorf("message body is null: %w", ErrBadMessage)
	}
	return b.Bytes(), nil
}

// deliver appends a message to to's inbox and fsyncs it.
func (m *Manager) deliver(from, to string, body []byte) (*Message, error) {
	body, err := checkBody(body)
	if err != nil {
		return nil, err
	}
	unlock := m.msg.lock(to)
	defer unlock()
	if _, err := m.Get(to); err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", to, ErrNotFound)
	}
	in, good, err := readInbox(m.inboxPath(to))
	if err != nil {
		return nil, fmt.Errorf("inbox of sandbox %q: %w", to, err)
	}
	if len(in.Messages) >= MaxInboxMessages || in.bytes()+len(body) > MaxInboxBytes {
		return nil, fmt.Errorf("sandbox %q: %w: it holds %d messages, %d bytes (at most %d and %d); it takes them with GET /v1/messages?take=true",
			to, ErrInboxFull, len(in.Messages), in.bytes(), MaxInboxMessages, MaxInboxBytes)
	}
	msg := &Message{ID: in.Next, From: from, To: to, Time: time.Now().UTC(), Body: body}
	line, err := encodeMessage(msg)
	if err != nil {
		return nil, err
	}
	if err := appendInbox(m.inboxPath(to), good, line); err != nil {
		return nil, fmt.Errorf("inbox of sandbox %q: %w", to, err)
	}
	m.msg.wake(to)
	return msg, nil
}

// ReadOptions says which messages Messages returns.
type ReadOptions struct {
	// After skips messages whose ID is not above it.
	After uint64
	// Take removes the messages returned from the inbox.
	Take bool
	// Wait, when no message is there, waits this long for one (at most
	// MaxMessageWait).
	Wait time.Duration
}

// Messages returns the messages in sandbox name's inbox, oldest first.
func (m *Manager) Messages(ctx context.Context, name string, o ReadOptions) ([]Message, error) {
	if _, err := m.Get(name); err != nil {
		return nil, err
	}
	wait := min(max(o.Wait, 0), MaxMessageWait)
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		changed := m.msg.wait(name)
		out, err := m.readMessages(name, o)
		if err != nil || len(out) > 0 {
			return out, err
		}
		select {
		case <-changed:
		case <-t.C:
			return []Message{}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// readMessages returns what is in the inbox after o.After, taking it when
// o.Take.
func (m *Manager) readMessages(name string, o ReadOptions) ([]Message, error) {
	unlock := m.msg.lock(name)
	defer unlock()
	p := m.inboxPath(name)
	in, _, err := readInbox(p)
	if err != nil {
		return nil, fmt.Errorf("inbox of sandbox %q: %w", name, err)
	}
	out := []Message{}
	var keep []Message
	for _, msg := range in.Messages {
		if msg.ID > o.After {
			out = append(out, msg)
		} else {
			keep = append(keep, msg)
		}
	}
	if o.Take && len(out) > 0 {
		in.Messages = keep
		if err := rewriteInbox(p, in); err != nil {
			return nil, fmt.Errorf("inbox of sandbox %q: %w", name, err)
		}
	}
	return out, nil
}

// Inbox is an inbox file decoded.
type Inbox struct {
	// Next is the ID the next message gets.
	Next     uint64
	Messages []Message
}

func (in *Inbox) bytes() int {
	n := 0
	for _, m := range in.Messages {
		n += len(m.Body)
	}
	return n
}

// inboxHeader is the first line of a rewritten inbox: the next ID, so
// IDs keep growing after every message was taken.
type inboxHeader struct {
	Next uint64 `json:"next"`
}

// encodeMessage is a message's line in an inbox file.
func encodeMessage(msg *Message) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the body stays as it was sent
	if err := enc.Encode(msg); err != nil {
		return nil, fmt.Errorf("encode message: %w", err)
	}
	return b.Bytes(), nil
}

// validMessage says whether a decoded line is a message tine could have
// written.
func validMessage(msg *Message) bool {
	if msg.ID == 0 || !nameRE().MatchString(msg.To) || !(msg.From == HostSender || nameRE().MatchString(msg.From)) {
		return false
	}
	b, err := checkBody(msg.Body)
	return err == nil && bytes.Equal(b, msg.Body)
}

// DecodeInbox decodes an inbox file's bytes. Lines that do not decode to
// a message are skipped; a last line without its newline (an append a
// crash cut short, never answered) is left out, and good is the length
// of what precedes it. Messages are kept in the order of their IDs; a
// repeated or lower ID is skipped.
func DecodeInbox(b []byte) (in Inbox, good int) {
	var next, last uint64
	good = bytes.LastIndexByte(b, '\n') + 1
	rest := b[:good]
	first := true
	for len(rest) > 0 && len(in.Messages) < 2*MaxInboxMessages {
		line, r, _ := bytes.Cut(rest, []byte{'\n'})
		rest = r
		if first {
			first = false
			var h inboxHeader
			if bytes.HasPrefix(line, []byte(`{"next":`)) && json.Unmarshal(line, &h) == nil && h.Next != ^uint64(0) {
				next = h.Next
				continue
			}
		}
		var msg Message
		if err := json.Unmarshal(line, &msg); err != nil || !validMessage(&msg) || msg.ID <= last || msg.ID == ^uint64(0) {
			continue
		}
		in.Messages = append(in.Messages, msg)
		last = msg.ID
	}
	in.Next = max(next, last+1, 1)
	return in, good
}

// readInbox reads and decodes an inbox file; none is an empty inbox.
func readInbox(p string) (Inbox, int, error) {
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return Inbox{Next: 1}, 0, nil
	}
	if err != nil {
		return Inbox{}, 0, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxInboxFile+1))
	if err != nil {
		return Inbox{}, 0, err
	}
	if len(b) > maxInboxFile {
		return Inbox{}, 0, fmt.Errorf("%s is over %d bytes", p, maxInboxFile)
	}
	in, good := DecodeInbox(b)
	return in, good, nil
}

// appendInbox appends line to the inbox file at p, cutting first what
// follows its good bytes (an append a crash cut short), and fsyncs it.
func appendInbox(p string, good int, line []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err == nil && st.Size() != int64(good) {
		err = f.Truncate(int64(good))
	}
	if err == nil {
		_, err = f.WriteAt(line, int64(good))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && good == 0 {
		err = atomicfile.SyncDir(filepath.Dir(p))
	}
	return err
}

// rewriteInbox replaces the inbox file at p with in, atomically.
func rewriteInbox(p string, in Inbox) error {
	h, _ := json.Marshal(inboxHeader{Next: in.Next})
	b := append(h, '\n')
	for i := range in.Messages {
		line, err := encodeMessage(&in.Messages[i])
		if err != nil {
			return err
		}
		b = append(b, line...)
	}
	return atomicfile.WriteFile(p, b, 0o600)
}
