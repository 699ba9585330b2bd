package ns

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestBindsOverlap: a bind that waits does not hold up the next one (a
// fork's sandboxes bind at once), and each thread goes back to the
// host's namespaces after its bind.
func TestBindsOverlap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: setns into a mount namespace")
	}
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	entered, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- inNamespaces(pidfd, nil, func() error {
			close(entered)
			select {
			case <-release:
				return nil
			case <-time.After(20 * time.Second):
				return errors.New("the second bind did not run while the first one waited")
			}
		})
	}()
	<-entered
	if err := inNamespaces(pidfd, nil, func() error { close(release); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"mnt", "uts"} {
		if err := sameNamespace(n); err != nil {
			t.Error(err)
		}
	}
}
