package strayfd

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCloseKeepsCloexecAndLow: a descriptor without close-on-exec at or
// above from is closed; one below from, and one with the flag, stay.
func TestCloseKeepsCloexecAndLow(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stray, err := unix.Dup(int(f.Fd())) // no close-on-exec
	if err != nil {
		t.Fatal(err)
	}
	kept, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(kept)
	if err := Close(stray); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(stray), unix.F_GETFD, 0); err != unix.EBADF {
		t.Fatalf("stray descriptor %d still open (%v)", stray, err)
	}
	if _, err := unix.FcntlInt(uintptr(kept), unix.F_GETFD, 0); err != nil {
		t.Fatalf("close-on-exec descriptor %d closed: %v", kept, err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0); err != nil {
		t.Fatalf("descriptor below from closed: %v", err)
	}
}
