package nsinit

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// LoopbackUp brings up lo, the only interface of a new network namespace
// (and of a VM guest's kernel), so that services listen on 127.0.0.1.
func LoopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_UP | unix.IFF_LOOPBACK | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	return nil
}

// kept are the capabilities the agent and the sandbox's root keep: enough
// to own files, switch users and signal its own processes; no mounts,
// tracing, raw sockets, devices, modules, clock or administration.
var kept = map[uintptr]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FOWNER: true, unix.CAP_FSETID: true,
	unix.CAP_KILL: true, unix.CAP_SETGID: true, unix.CAP_SETUID: true, unix.CAP_SETPCAP: true,
	unix.CAP_NET_BIND_SERVICE: true,
}

// dropCapabilities removes every other capability from the bounding set,
// which bounds what root gets at the next exec, and clears the ambient set.
func dropCapabilities() error {
	for c := uintptr(0); c <= 63; c++ {
		if kept[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // past the kernel's last capability
			}
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	return nil
}
