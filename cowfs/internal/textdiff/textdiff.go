// Package textdiff writes the line differences between two texts as
// unified-diff hunks. Memory and time are bounded by the callers' bound
// on the texts and by MaxEdits, past which the shortest edit script is no
// longer sought.
package textdiff

import (
	"bufio"
	"fmt"
	"strings"
)

// MaxEdits bounds the differences Myers' algorithm searches: the search
// keeps O(MaxEdits²) integers. Past it, the rest of the changed middle
// is written as one removal and one addition, which is still a correct
// (if longer) diff.
const MaxEdits = 1000

// Unified writes the hunks (from the first "@@" line on) that turn a into
// b, with ctxLines lines of context. A last line without a newline is
// marked the way diff and git do.
func Unified(w *bufio.Writer, a, b []byte, ctxLines int) {
	writeHunks(w, diffLines(splitLines(a), splitLines(b)), ctxLines)
}

// splitLines splits b after each newline; the last line may lack one.
func splitLines(b []byte) []string {
	s := string(b)
	var out []string
	for len(s) > 0 {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

// editOp is one step of a line edit script.
type editOp struct {
	kind byte // ' ', '-', '+'
	line string
}

// diffLines computes an edit script from a to b.
func diffLines(a, b []string) []editOp {
	// Trim a common prefix and suffix first: cheap and usually most lines.
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	ops := make([]editOp, 0, len(a)+len(b)-pre-suf)
	for _, l := range a[:pre] {
		ops = append(ops, editOp{' ', l})
	}
	ops = append(ops, myers(a[pre:len(a)-suf], b[pre:len(b)-suf])...)
	for _, l := range a[len(a)-suf:] {
		ops = append(ops, editOp{' ', l})
	}
	return ops
}

// myers finds a shortest edit script with Myers' greedy algorithm, or,
// past MaxEdits differences, replaces a by b wholesale.
func myers(a, b []string) []editOp {
	n, m := len(a), len(b)
	maxD := min(n+m, MaxEdits)
	if n+m == 0 {
		return nil
	}
	var trace [][]int
	off := maxD + 1
	v := make([]int, 2*maxD+3)
	found := -1
	for d := 0; d <= maxD; d++ {
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[off+k] = x
			if x >= n && y >= m {
				found = d
				break
			}
		}
		// Keep the band [-d, d] of v for the backtrack.
		trace = append(trace, append([]int(nil), v[off-d:off+d+1]...))
		if found >= 0 {
			break
		}
	}
	if found < 0 {
		ops := make([]editOp, 0, n+m)
		for _, l := range a {
			ops = append(ops, editOp{'-', l})
		}
		for _, l := range b {
			ops = append(ops, editOp{'+', l})
		}
		return ops
	}
	get := func(d, k int) int { return trace[d][k+d] }
	var rev []editOp
	x, y := n, m
	for d := found; d > 0; d-- {
		k := x - y
		var pk int
		if k == -d || (k != d && get(d-1, k-1) < get(d-1, k+1)) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := get(d-1, pk)
		py := px - pk
		for x > px && y > py {
			x--
			y--
			rev = append(rev, editOp{' ', a[x]})
		}
		if x == px {
			y--
			rev = append(rev, editOp{'+', b[y]})
		} else {
			x--
			rev = append(rev, editOp{'-', a[x]})
		}
	}
	for x > 0 && y > 0 {
		x--
		y--
		rev = append(rev, editOp{' ', a[x]})
	}
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

// writeHunks writes an edit script as unified-diff hunks.
func writeHunks(w *bufio.Writer, ops []editOp, ctxLines int) {
	i := 0
	ai, bi := 0, 0 // line numbers (0-based) at ops[i]
	for i < len(ops) {
		// Find the next change.
		for i < len(ops) && ops[i].kind == ' ' {
			i++
			ai++
			bi++
		}
		if i >= len(ops) {
			return
		}
		start := max(i-ctxLines, 0)
		// Extend while changes are within 2*ctxLines of each other.
		end := i
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := 0
			for end+run < len(ops) && ops[end+run].kind == ' ' {
				run++
			}
			if end+run >= len(ops) || run > 2*ctxLines {
				end += min(run, ctxLines)
				break
			}
			end += run
		}
		back := i - start
		as, bs := ai-back, bi-back
		var al, bl int
		for _, op := range ops[start:end] {
			if op.kind != '+' {
				al++
			}
			if op.kind != '-' {
				bl++
			}
		}
		fmt.Fprintf(w, "@@ -%s +%s @@\n", hunkRange(as, al), hunkRange(bs, bl))
		for _, op := range ops[start:end] {
			w.WriteByte(op.kind)
			w.WriteString(op.line)
			if !strings.HasSuffix(op.line, "\n") {
				w.WriteString("\n\\ No newline at end of file\n")
			}
		}
		for _, op := range ops[i:end] {
			if op.kind != '+' {
				ai++
			}
			if op.kind != '-' {
				bi++
			}
		}
		i = end
	}
}

func hunkRange(start, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	if n == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}
