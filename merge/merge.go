// Package merge is a line-by-line three-way merge of text, in the manner
// of diff3 and git merge-file: changes from a common base on two sides
// are combined when they touch different lines, and a change to the same
// lines on both sides (unless both made the same change) is a conflict.
//
// Inputs may come from a sandbox and are untrusted: the work is bounded
// (MaxLines, MaxEdits) and an input past the bounds is reported as
// ErrTooLarge, never as a partial merge.
package merge

import (
	"bytes"
	"errors"
)

// Bounds on the inputs of Merge.
const (
	// MaxLines is the most lines one side may have.
	MaxLines = 1 << 20
	// MaxEdits bounds the edit distance between the base and one side
	// after their common start and end are set aside; the diff's memory
	// grows with its square.
	MaxEdits = 2000
)

// ErrTooLarge reports an input past MaxLines or MaxEdits.
var ErrTooLarge = errors.New("too large or too different to merge line by line")

// Conflict is one region changed differently on both sides. Lines are
// numbered from 1; Start is where the region starts in each input.
type Conflict struct {
	BaseStart   int      `json:"base_start"`
	OursStart   int      `json:"ours_start"`
	TheirsStart int      `json:"theirs_start"`
	Base        []string `json:"base"`
	Ours        []string `json:"ours"`
	Theirs      []string `json:"theirs"`
}

// Result is a merge's outcome. When Conflicts is empty, Merged is the
// merged text; otherwise Merged holds the text with git-style conflict
// markers.
type Result struct {
	Merged    []byte
	Conflicts []Conflict
}

// Binary reports whether data looks like binary content (a NUL byte in
// its first 8000 bytes, as git decides), which Merge does not merge.
func Binary(data []byte) bool {
	return bytes.IndexByte(data[:min(len(data), 8000)], 0) >= 0
}

// Lines splits text into lines, each keeping its "\n" (the last may lack
// one).
func Lines(text []byte) []string {
	var out []string
	for len(text) > 0 {
		i := bytes.IndexByte(text, '\n')
		if i < 0 {
			out = append(out, string(text))
			break
		}
		out = append(out, string(text[:i+1]))
		text = text[i+1:]
	}
	return out
}

// Merge merges the changes from base to ours and from base to theirs.
func Merge(base, ours, theirs []byte) (*Result, error) {
	b, o, t := Lines(base), Lines(ours), Lines(theirs)
	if len(b) > MaxLines || len(o) > MaxLines || len(t) > MaxLines {
		return nil, ErrTooLarge
	}
	ids := map[string]int32{}
	intern := func(ls []string) []int32 {
		out := make([]int32, len(ls))
		for i, l := range ls {
			id, ok := ids[l]
			if !ok {
				id = int32(len(ids))
				ids[l] = id
			}
			out[i] = id
		}
		return out
	}
	bi, oi, ti := intern(b), intern(o), intern(t)
	mo, err := match(bi, oi)
	if err != nil {
		return nil, err
	}
	mt, err := match(bi, ti)
	if err != nil {
		return nil, err
	}
	res := &Result{}
	var out bytes.Buffer
	emit := func(ls []string) {
		for _, l := range ls {
			out.WriteString(l)
		}
	}
	lb, lo, lt := 0, 0, 0
	for lb < len(b) || lo < len(o) || lt < len(t) {
		// A stable run: lines matched in the base and both sides, in step.
		i := 0
		for lb+i < len(b) && mo[lb+i] == lo+i && mt[lb+i] == lt+i {
			i++
		}
		if i > 0 {
			emit(b[lb : lb+i])
			lb, lo, lt = lb+i, lo+i, lt+i
			continue
		}
		// An unstable run up to the next base line matched on both sides.
		n := lb
		for n < len(b) && (mo[n] < 0 || mt[n] < 0) {
			n++
		}
		eo, et := len(o), len(t)
		if n < len(b) {
			eo, et = mo[n], mt[n]
		}
		cb, co, ct := b[lb:n], o[lo:eo], t[lt:et]
		switch {
		case equal(co, cb):
			emit(ct)
		case equal(ct, cb), equal(co, ct):
			emit(co)
		default:
			res.Conflicts = append(res.Conflicts, Conflict{BaseStart: lb + 1, OursStart: lo + 1, TheirsStart: lt + 1,
				Base: cb, Ours: co, Theirs: ct})
			out.WriteString("<<<<<<< ours\n")
			emitEnded(&out, co)
			out.WriteString("=======\n")
			emitEnded(&out, ct)
			out.WriteString(">>>>>>> theirs\n")
		}
		lb, lo, lt = n, eo, et
	}
	res.Merged = out.Bytes()
	return res, nil
}

// emitEnded writes lines, ending the last with a newline if it lacks one.
func emitEnded(out *bytes.Buffer, ls []string) {
	for _, l := range ls {
		out.WriteString(l)
	}
	if n := len(ls); n > 0 && ls[n-1][len(ls[n-1])-1] != '\n' {
		out.WriteByte('\n')
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// match returns, for each line of a, the index of the line of b it is
// paired with in a longest common subsequence, or -1.
func match(a, b []int32) ([]int, error) {
	m := make([]int, len(a))
	for i := range m {
		m[i] = -1
	}
	// Common start and end first: the usual edit is small.
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		m[p] = p
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		m[len(a)-1-s] = len(b) - 1 - s
		s++
	}
	pairs, err := myers(a[p:len(a)-s], b[p:len(b)-s])
	if err != nil {
		return nil, err
	}
	for _, pr := range pairs {
		m[p+pr[0]] = p + pr[1]
	}
	return m, nil
}

// myers finds a shortest edit script from a to b (Myers' O(ND) greedy
// algorithm) and returns the pairs of equal lines it keeps, in order.
func myers(a, b []int32) ([][2]int, error) {
	n, m := len(a), len(b)
	if n == 0 || m == 0 {
		return nil, nil
	}
	max := min(n+m, MaxEdits)
	off := max + 1
	v := make([]int, 2*max+3)
	var trace [][]int32
	found := -1
	for d := 0; d <= max && found < 0; d++ {
		row := make([]int32, 2*d+1)
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || k != d && v[off+k-1] < v[off+k+1] {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x, y = x+1, y+1
			}
			v[off+k] = x
			row[k+d] = int32(x)
			if x >= n && y >= m {
				found = d
				break
			}
		}
		trace = append(trace, row)
	}
	if found < 0 {
		return nil, ErrTooLarge
	}
	// Walk back: each step is a snake (equal lines) after one edit.
	var pairs [][2]int
	x, y := n, m
	for d := found; d > 0; d-- {
		prev := trace[d-1]
		at := func(k int) int { return int(prev[k+d-1]) }
		k := x - y
		pk := k - 1
		if k == -d || k != d && at(k-1) < at(k+1) {
			pk = k + 1
		}
		px := at(pk)
		py := px - pk
		for x > px && y > py {
			x, y = x-1, y-1
			pairs = append(pairs, [2]int{x, y})
		}
		x, y = px, py
	}
	for x > 0 && y > 0 {
		x, y = x-1, y-1
		pairs = append(pairs, [2]int{x, y})
	}
	for i, j := 0, len(pairs)-1; i < j; i, j = i+1, j-1 {
		pairs[i], pairs[j] = pairs[j], pairs[i]
	}
	return pairs, nil
}
