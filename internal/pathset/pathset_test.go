package pathset

import (
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"testing"
)

func TestSet(t *testing.T) {
	var s Set
	if !s.Empty() {
		t.Error("the zero Set is not empty")
	}
	for _, p := range []string{"a", "a/b/c", "x.y", "d/e"} {
		s.Add(p)
	}
	above := func(p string) []string {
		var out []string
		s.Above(p, func(a string) bool { out = append(out, a); return true })
		return out
	}
	for _, c := range []struct {
		p          string
		has, below bool
		within     bool
		above      []string
	}{
		{p: "a", has: true, below: true, within: true},
		{p: "a/b", below: true, within: true, above: []string{"a"}},
		{p: "a/b/c/d", within: true, above: []string{"a", "a/b/c"}},
		{p: "a.b", within: false},
		{p: "x.y/z", within: true, above: []string{"x.y"}},
		{p: "x", within: false},
		{p: "d", below: true},
		{p: "", below: true},
	} {
		if got := s.Has(c.p); got != c.has {
			t.Errorf("Has(%q) = %v", c.p, got)
		}
		if got := s.HasBelow(c.p); got != c.below {
			t.Errorf("HasBelow(%q) = %v", c.p, got)
		}
		if got := s.Within(c.p); got != c.within {
			t.Errorf("Within(%q) = %v", c.p, got)
		}
		if got := above(c.p); !slices.Equal(got, c.above) {
			t.Errorf("Above(%q) = %q, want %q", c.p, got, c.above)
		}
	}
	if s.Empty() {
		t.Error("a Set with members is empty")
	}
	var first []string
	s.Above("a/b/c/d", func(a string) bool { first = append(first, a); return false })
	if !slices.Equal(first, []string{"a"}) {
		t.Errorf("Above did not stop when told: %q", first)
	}
}

// TestSetMatchesMap checks the set against the plain definition on random
// paths: ancestors found by walking path.Dir and a map.
func TestSetMatchesMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "b", "a.b", "ab", "é", "\xff"}
	randPath := func() string {
		parts := make([]string, 1+r.IntN(5))
		for i := range parts {
			parts[i] = names[r.IntN(len(names))]
		}
		return strings.Join(parts, "/")
	}
	for round := 0; round < 200; round++ {
		var s Set
		m := map[string]bool{}
		for i := r.IntN(20); i > 0; i-- {
			p := randPath()
			s.Add(p)
			m[p] = true
		}
		for i := 0; i < 50; i++ {
			p := randPath()
			var want []string
			for a := path.Dir(p); a != "."; a = path.Dir(a) {
				if m[a] {
					want = append([]string{a}, want...)
				}
			}
			var got []string
			s.Above(p, func(a string) bool { got = append(got, a); return true })
			if !slices.Equal(got, want) {
				t.Fatalf("Above(%q) = %q, want %q", p, got, want)
			}
			below := false
			for q := range m {
				below = below || strings.HasPrefix(q, p+"/")
			}
			if s.HasAbove(p) != (len(want) > 0) || s.Has(p) != m[p] || s.HasBelow(p) != below || s.Within(p) != (m[p] || len(want) > 0) {
				t.Fatalf("%q: Has %v HasBelow %v Within %v; map says %v %v", p, s.Has(p), s.HasBelow(p), s.Within(p), m[p], below)
			}
		}
	}
}

// TestSetDeep: a path thousands of names deep finds its one ancestor.
func TestSetDeep(t *testing.T) {
	deep := strings.Repeat("d/", 5000) + "f"
	var s Set
	s.Add("d")
	n := 0
	for i := 0; i < 2000; i++ {
		s.Above(deep, func(string) bool { n++; return true })
	}
	if n != 2000 {
		t.Fatalf("found %d ancestors, want 2000", n)
	}
}
