package merge

import (
	"errors"
	"math/rand"
	"strings"
	"testing"
)

func TestMerge(t *testing.T) {
	for _, tc := range []struct {
		name, base, ours, theirs, want string
		conflicts                      int
	}{
		{"both sides edit other lines", "a\nb\nc\nd\ne\n", "A\nb\nc\nd\ne\n", "a\nb\nc\nd\nE\n", "A\nb\nc\nd\nE\n", 0},
		{"one side only", "a\nb\n", "a\nb\n", "a\nB\nc\n", "a\nB\nc\n", 0},
		{"same change on both", "a\nb\nc\n", "a\nX\nc\n", "a\nX\nc\n", "a\nX\nc\n", 0},
		{"insertions at both ends", "m\n", "top\nm\n", "m\nbottom\n", "top\nm\nbottom\n", 0},
		{"deletion and distant edit", "a\nb\nc\nd\ne\nf\n", "a\nc\nd\ne\nf\n", "a\nb\nc\nd\ne\nF\n", "a\nc\nd\ne\nF\n", 0},
		{"same line differently", "a\nb\nc\n", "a\nours\nc\n", "a\ntheirs\nc\n", "a\n<<<<<<< ours\nours\n=======\ntheirs\n>>>>>>> theirs\nc\n", 1},
		{"edit against delete", "a\nb\nc\n", "a\nc\n", "a\nB\nc\n", "a\n<<<<<<< ours\n=======\nB\n>>>>>>> theirs\nc\n", 1},
		{"no final newline", "a\nm\nb", "A\nm\nb", "a\nm\nB", "A\nm\nB", 0},
		{"adjacent lines conflict", "a\nb\n", "A\nb\n", "a\nB\n", "<<<<<<< ours\nA\nb\n=======\na\nB\n>>>>>>> theirs\n", 1},
		{"empty base", "", "x\n", "y\n", "<<<<<<< ours\nx\n=======\ny\n>>>>>>> theirs\n", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Merge([]byte(tc.base), []byte(tc.ours), []byte(tc.theirs))
			if err != nil {
				t.Fatal(err)
			}
			if string(r.Merged) != tc.want || len(r.Conflicts) != tc.conflicts {
				t.Fatalf("merged %q with %d conflicts, want %q with %d", r.Merged, len(r.Conflicts), tc.want, tc.conflicts)
			}
		})
	}
}

func TestConflictSides(t *testing.T) {
	r, err := Merge([]byte("1\n2\n3\n4\n"), []byte("1\n2\nx\n4\n"), []byte("1\n2\ny\nz\n4\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Conflicts) != 1 {
		t.Fatalf("conflicts %+v", r.Conflicts)
	}
	c := r.Conflicts[0]
	if c.BaseStart != 3 || c.OursStart != 3 || c.TheirsStart != 3 || strings.Join(c.Ours, "") != "x\n" || strings.Join(c.Theirs, "") != "y\nz\n" || strings.Join(c.Base, "") != "3\n" {
		t.Fatalf("conflict %+v", c)
	}
}

// TestRandomEdits applies random edits to disjoint halves of a file on
// each side: the merge must be clean and hold both.
func TestRandomEdits(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for iter := 0; iter < 300; iter++ {
		n := 4 + rng.Intn(60)
		base := make([]string, n)
		for i := range base {
			base[i] = string(rune('a'+rng.Intn(5))) + "\n"
		}
		mid := n / 2
		edit := func(ls []string, tag string) []string {
			out := append([]string(nil), ls...)
			for k := 0; k < 1+rng.Intn(3); k++ {
				if len(out) == 0 {
					break
				}
				i := rng.Intn(len(out))
				switch rng.Intn(3) {
				case 0:
					out[i] = tag + out[i]
				case 1:
					out = append(out[:i], out[i+1:]...)
				default:
					out = append(out[:i], append([]string{tag + "new\n"}, out[i:]...)...)
				}
			}
			return out
		}
		// A unique separator keeps the two halves apart in any alignment.
		sep := []string{"=SEP1=\n", "=SEP2=\n", "=SEP3=\n"}
		top, bot := base[:mid], base[mid:]
		join := func(a, b []string) string { return strings.Join(a, "") + strings.Join(sep, "") + strings.Join(b, "") }
		et, eb := edit(top, "O"), edit(bot, "T")
		b, o, th := join(top, bot), join(et, bot), join(top, eb)
		r, err := Merge([]byte(b), []byte(o), []byte(th))
		if err != nil {
			t.Fatal(err)
		}
		if want := join(et, eb); len(r.Conflicts) != 0 || string(r.Merged) != want {
			t.Fatalf("iter %d: base %q ours %q theirs %q: merged %q (%d conflicts), want %q", iter, b, o, th, r.Merged, len(r.Conflicts), want)
		}
	}
}

func TestTooDifferent(t *testing.T) {
	var a, b strings.Builder
	for i := 0; i < 3*MaxEdits; i++ {
		a.WriteString("a\n")
		b.WriteString("b\n")
	}
	if _, err := Merge([]byte(a.String()), []byte(b.String()), []byte(a.String())); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err %v, want ErrTooLarge", err)
	}
}

func FuzzMerge(f *testing.F) {
	f.Add([]byte("a\nb\nc\n"), []byte("a\nB\nc\n"), []byte("a\nb\nC\n"))
	f.Add([]byte(""), []byte("x"), []byte("y\n"))
	f.Add([]byte("1\n2\n"), []byte("2\n1\n"), []byte("1\n"))
	f.Fuzz(func(t *testing.T, b, o, th []byte) {
		r, err := Merge(b, o, th)
		if err != nil {
			return
		}
		same := func(x, y []byte) bool { return string(x) == string(y) }
		switch {
		case same(b, o) && len(r.Conflicts) == 0 && !same(r.Merged, th):
			t.Fatalf("ours unchanged: merged %q, want theirs %q", r.Merged, th)
		case same(b, th) && len(r.Conflicts) == 0 && !same(r.Merged, o):
			t.Fatalf("theirs unchanged: merged %q, want ours %q", r.Merged, o)
		case same(o, th) && (len(r.Conflicts) != 0 || !same(r.Merged, o)):
			t.Fatalf("same change: merged %q with %d conflicts", r.Merged, len(r.Conflicts))
		}
		if (same(b, o) || same(b, th)) && len(r.Conflicts) != 0 {
			t.Fatalf("one side unchanged yet %d conflicts", len(r.Conflicts))
		}
	})
}
