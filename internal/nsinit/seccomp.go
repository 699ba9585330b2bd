package nsinit

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccomp return values and the offsets of struct seccomp_data.
const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	offNr     = 0
	offArch   = 4
	offArg0   = 16 // low 32 bits on a little-endian machine
	// x32 system calls are the native numbers with this bit set.
	x32Bit = 0x40000000
)

// filter returns the default seccomp program: the native ABI only; the
// system calls in denied fail with EPERM; clone and unshare fail with
// EPERM when asked for a user namespace; clone3, whose flags a filter
// cannot read, fails with ENOSYS so that libc falls back to clone.
func filter() ([]unix.SockFilter, error) {
	if auditArch == 0 {
		return nil, fmt.Errorf("seccomp filter: no system call table for %s", runtime.GOARCH)
	}
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jeq := func(k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: k, Jt: jt, Jf: jf}
	}
	ld := func(off uint32) unix.SockFilter { return stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, off) }
	ret := func(v uint32) unix.SockFilter { return stmt(unix.BPF_RET|unix.BPF_K, v) }

	// Layout: header, one jeq per denied call, the three special calls,
	// then the tail: allow | check-arg0 (ld, jset, allow) | eperm | enosys.
	n := len(denied)
	var p []unix.SockFilter
	// header (4): arch check, x32 check
	p = append(p, ld(offArch))
	// body starts at 4; the tail (allow first) follows it.
	body := 4
	tail := body + n + 3
	check, eperm, enosys := tail+1, tail+4, tail+5
	rel := func(at, to int) uint8 { return uint8(to - at - 1) }
	p = append(p, jeq(auditArch, 0, rel(1, eperm)))
	p = append(p, ld(offNr))
	p = append(p, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, K: x32Bit, Jt: rel(3, eperm)})
	for i, nr := range denied {
		p = append(p, jeq(uint32(nr), rel(body+i, eperm), 0))
	}
	at := body + n
	p = append(p, jeq(unix.SYS_CLONE, rel(at, check), 0))
	p = append(p, jeq(unix.SYS_UNSHARE, rel(at+1, check), 0))
	p = append(p, jeq(unix.SYS_CLONE3, rel(at+2, enosys), 0))
	p = append(p, ret(retAllow)) // allow
	p = append(p, ld(offArg0))   // check
	p = append(p, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, K: unix.CLONE_NEWUSER, Jt: rel(check+1, eperm)})
	p = append(p, ret(retAllow))
	p = append(p, ret(retEPERM))  // eperm
	p = append(p, ret(retENOSYS)) // enosys
	if len(p) != enosys+1 || enosys > 255 {
		return nil, fmt.Errorf("seccomp filter: bad layout (%d instructions)", len(p))
	}
	return p, nil
}

// installFilter sets no_new_privs and loads the default filter on every
// thread of the process; it is inherited by exec and fork.
func installFilter() error {
	prog, err := filter()
	if err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fp)))
	runtime.KeepAlive(prog)
	if e != 0 {
		return fmt.Errorf("load seccomp filter: %w", e)
	}
	return nil
}

// FilterSupported reports whether this architecture has a seccomp
// filter: without one the init step fails.
func FilterSupported() bool { return auditArch != 0 }
