package guestagent

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openPTY opens a new pseudo-terminal of rows x cols (24 x 80 when zero).
// The terminal side is opened from the master with TIOCGPTPEER, not by a
// path under /dev/pts, so no file in the sandbox can stand in for it.
func openPTY(rows, cols uint16) (master, term *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open a terminal: %w", err)
	}
	var tfd uintptr
	err = control(m, func(fd uintptr) error {
		if err := unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock /dev/ptmx: %w", err)
		}
		var errno unix.Errno
		tfd, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
		if errno != 0 {
			return fmt.Errorf("open the terminal side (TIOCGPTPEER): %w", errno)
		}
		return nil
	})
	if err == nil {
		err = setWinsize(m, rows, cols)
	}
	if err != nil {
		m.Close()
		if tfd != 0 {
			unix.Close(int(tfd))
		}
		return nil, nil, err
	}
	return m, os.NewFile(tfd, "pty"), nil
}

// setWinsize sets the terminal's window size (24 x 80 for zeros).
func setWinsize(m *os.File, rows, cols uint16) error {
	if rows == 0 {
		rows = 24
	}
	if cols == 0 {
		cols = 80
	}
	return control(m, func(fd uintptr) error {
		if err := unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
			return fmt.Errorf("set terminal size %dx%d: %w", rows, cols, err)
		}
		return nil
	})
}

// control runs fn on f's descriptor without taking it out of the poller
// (as f.Fd would).
func control(f *os.File, fn func(fd uintptr) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(fd) }); err != nil {
		return err
	}
	return ferr
}
