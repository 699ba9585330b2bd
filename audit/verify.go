package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
)

var errBufferFull = bufio.ErrBufferFull

func sum256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Report is what Verify found.
type Report struct {
	// Records is the number of records read and found sound.
	Records int64 `json:"records"`
	// Head is the last sound record's sequence number and hash.
	Head Head `json:"head"`
	// Problems lists what breaks the log, in order; empty when it is
	// whole. Only the first break of the chain is listed.
	Problems []string `json:"problems,omitempty"`
}

// OK says the log is whole.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// Verify reads a log from r and checks each record's hash, that each
// links the one before and that sequence numbers count up from 0. When
// want is given (the head file, or an anchor kept elsewhere), the log
// must reach that head: a log cut short, or rewritten from that record
// on, is reported. Verify reads at most MaxRecord bytes of any line.
func Verify(r io.Reader, want *Head) *Report {
	rep := &Report{Head: Head{Seq: -1, Hash: ZeroHash}}
	br := bufio.NewReaderSize(r, 64<<10)
	var found bool // the log holds want
	for n := int64(0); ; n++ {
		line, tooLong, err := readLine(br)
		if err == io.EOF {
			break
		}
		if err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("read record %d: %v", n, err))
			return rep
		}
		if tooLong {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d: longer than %d bytes", n, MaxRecord))
			return rep
		}
		if line[len(line)-1] != '\n' {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d: cut short (no newline at the end of the log)", n))
			return rep
		}
		rec, err := ParseRecord(line[:len(line)-1])
		if err != nil {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d: %v", n, err))
			return rep
		}
		if int64(rec.Seq) != n {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d: says it is record %d (records removed or reordered)", n, rec.Seq))
			return rep
		}
		if rec.Prev != rep.Head.Hash {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d: does not link the record before it (a record before it was changed or removed)", n))
			return rep
		}
		rep.Records++
		rep.Head = Head{Seq: int64(rec.Seq), Hash: rec.Hash}
		if want != nil && rep.Head == *want {
			found = true
		}
	}
	if want != nil && !found && want.Seq >= 0 {
		if want.Seq > rep.Head.Seq {
			rep.Problems = append(rep.Problems, fmt.Sprintf("the log ends at record %d but its head says %d: records were cut from its end", rep.Head.Seq, want.Seq))
		} else {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d does not have the hash the head gives (%.12s…): the log was rewritten", want.Seq, want.Hash))
		}
	}
	return rep
}

// VerifyFile verifies the log at path against its head file (see Verify).
// A missing head file is a problem once the log holds records.
func VerifyFile(path string) (*Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit verify %s: %w", path, err)
	}
	defer f.Close()
	h, ok, err := ReadHead(path)
	if err != nil {
		rep := Verify(f, nil)
		rep.Problems = append(rep.Problems, fmt.Sprintf("head file %s: %v", HeadPath(path), err))
		return rep, nil
	}
	if !ok {
		rep := Verify(f, nil)
		if rep.Records > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("head file %s is missing", HeadPath(path)))
		}
		return rep, nil
	}
	return Verify(f, &h), nil
}

// ReadAll decodes the records of a log from r, from record from on, and
// calls fn with each. It stops at the first damaged record with an error
// naming it (a damaged log is read up to there).
func ReadAll(r io.Reader, from int64, fn func(*Record) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for n := int64(0); ; n++ {
		line, tooLong, err := readLine(br)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if tooLong || line[len(line)-1] != '\n' {
			return fmt.Errorf("record %d: damaged (run tine audit verify)", n)
		}
		if n < from {
			continue
		}
		rec, err := ParseRecord(line[:len(line)-1])
		if err != nil {
			return fmt.Errorf("record %d: %w (run tine audit verify)", n, err)
		}
		if err := fn(rec); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
	}
}

// ErrStop, returned by ReadAll's fn, ends the reading without an error.
var ErrStop = errors.New("stop")
