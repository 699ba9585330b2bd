package chunkstore

import (
	"errors"
	"path/filepath"
	"testing"
)

// TestDeferredRefs: a deferred change is seen at once, is not on disk (a
// crash, here a copy of the directory, loses it), and is written by the
// next durable update, in order, or by Flush or Close.
func TestDeferredRefs(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	a, _ := s.Put([]byte("tree a"))
	b, _ := s.Put([]byte("tree b"))
	if err := s.SetRef("keep", ID{}, a); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateRefsDeferred(RefUpdate{Name: "lazy/1", New: a}, RefUpdate{Name: "lazy/2", New: b}); err != nil {
		t.Fatal(err)
	}
	if id, err := s.GetRef("lazy/2"); err != nil || id != b {
		t.Fatalf("deferred ref read back: %v %v", id, err)
	}
	if err := s.UpdateRefsDeferred(RefUpdate{Name: "lazy/1", Old: b, New: a}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a deferred change checks its old value: %v", err)
	}
	crashed := func() *Store {
		t.Helper()
		c := filepath.Join(t.TempDir(), "copy")
		copyDir(t, dir, c)
		return openT(t, c, nil)
	}
	c := crashed()
	if _, err := c.GetRef("lazy/1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a deferred ref survived a crash: %v", err)
	}
	if _, err := c.GetRef("keep"); err != nil {
		t.Errorf("the durable ref was lost: %v", err)
	}
	c.Close()

	// The next durable update writes the deferred ones first: a delete of
	// one made deferred is applied after it.
	if err := s.UpdateRefsDeferred(RefUpdate{Name: "lazy/3", New: b}); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateRefs(RefUpdate{Name: "lazy/3", Old: b}); err != nil {
		t.Fatal(err)
	}
	c = crashed()
	for name, want := range map[string]ID{"lazy/1": a, "lazy/2": b} {
		if id, err := c.GetRef(name); err != nil || id != want {
			t.Errorf("%s after the durable update and a crash: %v %v, want %s", name, id, err, want)
		}
	}
	if _, err := c.GetRef("lazy/3"); !errors.Is(err, ErrNotFound) {
		t.Errorf("lazy/3, made deferred and deleted durably, after a crash: %v", err)
	}
	c.Close()

	if err := s.UpdateRefsDeferred(RefUpdate{Name: "lazy/4", New: a}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	c = crashed()
	if _, err := c.GetRef("lazy/4"); err != nil {
		t.Errorf("a deferred ref after Flush and a crash: %v", err)
	}
	c.Close()

	if err := s.UpdateRefsDeferred(RefUpdate{Name: "lazy/5", New: b}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, nil)
	defer s.Close()
	if id, err := s.GetRef("lazy/5"); err != nil || id != b {
		t.Errorf("a deferred ref after Close: %v %v", id, err)
	}
}
