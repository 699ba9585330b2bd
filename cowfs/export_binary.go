package cowfs

import (
	"bufio"
	"compress/zlib"
	"fmt"
	"io"
)

// git's base85 alphabet (base85.c).
const b85Alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"

// b85Line is the most bytes git puts on one line of a binary patch.
const b85Line = 52

// b85Writer writes the lines of a git binary hunk: each line is a length
// byte ('A'-'Z' for 1-26, 'a'-'z' for 27-52) and the line's bytes in
// base85, five characters for each four bytes (zero-padded). It holds one
// line at a time.
type b85Writer struct {
	w   *bufio.Writer
	buf [b85Line]byte
	n   int
}

func (b *b85Writer) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		c := copy(b.buf[b.n:], p)
		b.n += c
		p = p[c:]
		if b.n == b85Line {
			b.line()
		}
	}
	return total, nil
}

// Close writes the last, short line.
func (b *b85Writer) Close() error {
	if b.n > 0 {
		b.line()
	}
	return nil
}

func (b *b85Writer) line() {
	if b.n <= 26 {
		b.w.WriteByte(byte('A' + b.n - 1))
	} else {
		b.w.WriteByte(byte('a' + b.n - 27))
	}
	for i := 0; i < b.n; i += 4 {
		var acc uint32
		for j := 0; j < 4; j++ {
			acc <<= 8
			if i+j < b.n {
				acc |= uint32(b.buf[i+j])
			}
		}
		var out [5]byte
		for j := 4; j >= 0; j-- {
			out[j] = b85Alphabet[acc%85]
			acc /= 85
		}
		b.w.Write(out[:])
	}
	b.w.WriteByte('\n')
	b.n = 0
}

// writeBinaryHunk writes one "literal" hunk of a git binary patch: the
// size, then r deflated and in base85 lines, then the blank line that
// ends the hunk. r is streamed; size must be its length.
func writeBinaryHunk(w *bufio.Writer, r io.Reader, size int64) error {
	fmt.Fprintf(w, "literal %d\n", size)
	bw := &b85Writer{w: w}
	zw := zlib.NewWriter(bw)
	if _, err := io.Copy(zw, r); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	bw.Close()
	return w.WriteByte('\n')
}
