// Package audit keeps append-only, hash-chained logs of JSON lines: one
// record a line, each holding the SHA-256 of the record before it, so that
// an edited, removed or reordered record breaks the chain. A head file
// beside the log holds the last record's sequence number and hash, so
// that a log cut short at its end is told apart from a whole one.
//
// The chain is tamper-evident, not tamper-proof: whoever can write the
// log and its head can write a new consistent chain. Verify takes an
// anchor (a head recorded elsewhere) to catch that too.
package audit

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxRecord is the most bytes of one record, its newline included.
// Append refuses bigger records; readers report them as damage.
const MaxRecord = 256 << 10

// Record is one line of a log.
type Record struct {
	// Seq counts the records of the log from 0.
	Seq uint64 `json:"seq"`
	// Time is when the record was appended (UTC).
	Time time.Time `json:"time"`
	// Kind says what happened: "create", "exec", "oom", ...
	Kind string `json:"kind"`
	// Fields are the details, as the appender gave them.
	Fields json.RawMessage `json:"fields,omitempty"`
	// Prev is the hash of the record before (64 zeros for the first).
	Prev string `json:"prev"`
	// Hash is the SHA-256 of the line up to the hash field (hex).
	Hash string `json:"hash"`
}

// Head is a log's last record: its sequence number and hash. A log with no
// record has Seq -1 and the zero hash.
type Head struct {
	Seq  int64  `json:"seq"`
	Hash string `json:"hash"`
}

// ZeroHash is the Prev of a log's first record.
var ZeroHash = strings.Repeat("0", 64)

// Log is one open log, appended to by one process at a time (the daemon).
// It is safe for concurrent use.
type Log struct {
	path string

	mu      sync.Mutex
	f       *os.File
	hf      *os.File // the head file, kept open: an append rewrites it in place
	head    Head
	changed chan struct{} // closed and replaced at each append
	err     error         // a failed append: the log takes no more
}

// HeadPath is the head file of the log at path.
func HeadPath(path string) string { return path + ".head" }

// Open opens the log at path, creating it (and its directory) when
// missing. It reads the log's last record to continue the chain; a log
// whose end is damaged is refused, so that no record is chained to a
// broken one (Verify says what is wrong).
func Open(path string) (*Log, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	head, err := lastHead(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit log %s: %w (run tine audit verify)", path, err)
	}
	hf, err := os.OpenFile(HeadPath(path), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	return &Log{path: path, f: f, hf: hf, head: head, changed: make(chan struct{})}, nil
}

// lastHead reads the last record of f.
func lastHead(f *os.File) (Head, error) {
	st, err := f.Stat()
	if err != nil {
		return Head{}, err
	}
	size := st.Size()
	if size == 0 {
		return Head{Seq: -1, Hash: ZeroHash}, nil
	}
	n := min(size, int64(MaxRecord))
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, size-n); err != nil {
		return Head{}, err
	}
	if buf[len(buf)-1] != '\n' {
		return Head{}, errors.New("the last record is cut short (no newline)")
	}
	line := buf[:len(buf)-1]
	if i := bytes.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	} else if n < size {
		return Head{}, fmt.Errorf("the last record is longer than %d bytes", MaxRecord)
	}
	r, err := ParseRecord(line)
	if err != nil {
		return Head{}, err
	}
	return Head{Seq: int64(r.Seq), Hash: r.Hash}, nil
}

// Path returns the log's file path.
func (l *Log) Path() string { return l.path }

// Head returns the log's last record's sequence number and hash.
func (l *Log) Head() Head {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head
}

// Changed returns a channel closed at the next append.
func (l *Log) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Append adds a record of kind with fields (which must marshal as JSON)
// and updates the head file. Records are written with one write each, in
// order; they are not synced one by one.
func (l *Log) Append(kind string, fields map[string]any) error {
	var fb []byte
	if len(fields) > 0 {
		var err error
		if fb, err = json.Marshal(fields); err != nil {
			return fmt.Errorf("audit %s: record %q: %w", l.path, kind, err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if l.f == nil {
		return fmt.Errorf("audit %s: %w", l.path, ErrClosed)
	}
	line, r, err := encode(uint64(l.head.Seq+1), time.Now().UTC(), kind, fb, l.head.Hash)
	if err != nil {
		return fmt.Errorf("audit %s: %w", l.path, err)
	}
	if _, err := l.f.Write(line); err != nil {
		// A partial line would break the chain for every later record.
		l.err = fmt.Errorf("audit %s: write failed, the log takes no more records until it is checked: %w", l.path, err)
		return l.err
	}
	l.head = Head{Seq: int64(r.Seq), Hash: r.Hash}
	if _, err := l.hf.WriteAt(headLine(l.head), 0); err != nil {
		return fmt.Errorf("audit %s: head file %s: %w", l.path, HeadPath(l.path), err)
	}
	close(l.changed)
	l.changed = make(chan struct{})
	return nil
}

// ErrClosed is the error of an append to a closed Log.
var ErrClosed = errors.New("the log is closed")

// Close closes the log; later appends fail with ErrClosed. Whoever waits
// on Changed is woken (and opens the log again to go on following it).
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := errors.Join(l.f.Close(), l.hf.Close())
	l.f, l.hf = nil, nil
	close(l.changed)
	l.changed = make(chan struct{})
	return err
}

// hashKey is what every line has between its body and its hash.
const hashKey = `,"hash":"`

// suffixLen is the bytes of a line after its body: hashKey, 64 hex
// digits, `"}`.
const suffixLen = len(hashKey) + 64 + 2

// encode makes a record's line (with its newline).
func encode(seq uint64, t time.Time, kind string, fields []byte, prev string) ([]byte, *Record, error) {
	body := struct {
		Seq    uint64          `json:"seq"`
		Time   time.Time       `json:"time"`
		Kind   string          `json:"kind"`
		Fields json.RawMessage `json:"fields,omitempty"`
		Prev   string          `json:"prev"`
	}{seq, t, kind, fields, prev}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, nil, err
	}
	b = b[:len(b)-1] // the closing brace
	sum := sum256(b)
	line := append(b, hashKey...)
	line = append(line, sum...)
	line = append(line, "\"}\n"...)
	if len(line) > MaxRecord {
		return nil, nil, fmt.Errorf("record %q: %d bytes, more than %d", kind, len(line), MaxRecord)
	}
	return line, &Record{Seq: seq, Time: t, Kind: kind, Fields: fields, Prev: prev, Hash: sum}, nil
}

// ParseRecord decodes one line (without its newline) and checks its own
// hash. It does not check the chain: see Verify.
func ParseRecord(line []byte) (*Record, error) {
	if len(line) >= MaxRecord {
		return nil, fmt.Errorf("record of %d bytes, more than %d", len(line), MaxRecord)
	}
	if len(line) < suffixLen+2 || string(line[len(line)-suffixLen:len(line)-suffixLen+len(hashKey)]) != hashKey ||
		string(line[len(line)-2:]) != `"}` {
		return nil, errors.New("not a record: no hash at its end")
	}
	body := line[:len(line)-suffixLen]
	got := string(line[len(line)-suffixLen+len(hashKey) : len(line)-2])
	if sum := sum256(body); sum != got {
		return nil, fmt.Errorf("hash mismatch: the record says %.12s…, its content hashes to %.12s…", got, sum)
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode: data after the record")
	}
	// Duplicate keys would let the decoded values differ from the hashed
	// ones; a record this package wrote has exactly this form.
	again, _, err := encode(r.Seq, r.Time, r.Kind, r.Fields, r.Prev)
	if err != nil || !bytes.Equal(again[:len(again)-1], line) {
		return nil, errors.New("record not in its canonical form")
	}
	return &r, nil
}

// headLine is the head file's content: a fixed-width line, written in
// place with one write, so that a reader never sees a mix of two heads.
func headLine(h Head) []byte {
	return fmt.Appendf(nil, "%020d %s\n", h.Seq, h.Hash)
}

// ReadHead reads the head file of the log at path; ok is false when it
// does not exist.
func ReadHead(path string) (h Head, ok bool, err error) {
	b, err := os.ReadFile(HeadPath(path))
	if errors.Is(err, os.ErrNotExist) {
		return Head{Seq: -1, Hash: ZeroHash}, false, nil
	}
	if err != nil {
		return h, false, err
	}
	h, err = ParseHead(string(b))
	return h, err == nil, err
}

// ParseHead decodes a head as the head file and Verify's report write it:
// "SEQ HASH".
func ParseHead(s string) (Head, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return Head{}, fmt.Errorf("head %q: want SEQ HASH", s)
	}
	seq, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || seq < -1 {
		return Head{}, fmt.Errorf("head %q: bad sequence number", s)
	}
	if _, err := hex.DecodeString(f[1]); err != nil || len(f[1]) != 64 {
		return Head{}, fmt.Errorf("head %q: bad hash", s)
	}
	return Head{Seq: seq, Hash: strings.ToLower(f[1])}, nil // records hold lower case
}

// String writes h as "SEQ HASH".
func (h Head) String() string { return fmt.Sprintf("%d %s", h.Seq, h.Hash) }

// readLine reads one line of at most MaxRecord bytes; a longer one is
// read to its end and reported.
func readLine(r interface {
	ReadSlice(byte) ([]byte, error)
}) (line []byte, tooLong bool, err error) {
	for {
		b, err := r.ReadSlice('\n')
		if len(line)+len(b) <= MaxRecord {
			line = append(line, b...)
		} else {
			tooLong = true
		}
		if err == nil || !errors.Is(err, errBufferFull) && err != nil {
			if err == io.EOF && len(line) == 0 && !tooLong {
				return nil, false, io.EOF
			}
			if err == io.EOF {
				err = nil
			}
			return line, tooLong, err
		}
	}
}
