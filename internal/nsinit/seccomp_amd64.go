package nsinit

import "golang.org/x/sys/unix"

const auditArch = unix.AUDIT_ARCH_X86_64

// denied are the system calls a sandbox never makes, after Docker's
// default profile: mounts and root changes, tracing other processes,
// kernel modules and kexec, the clock, kernel keyrings, BPF and perf,
// file handles, swap, accounting, reboot, namespace entry, raw I/O ports.
var denied = []uintptr{
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT,
	unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK,
	unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE, unix.SYS_MOUNT_SETATTR,
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_KCMP,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS, unix.SYS_QUERY_MODULE,
	unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_SETTIMEOFDAY, unix.SYS_ADJTIMEX,
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_SETNS, unix.SYS_REBOOT, unix.SYS_SWAPON, unix.SYS_SWAPOFF,
	unix.SYS_ACCT, unix.SYS_QUOTACTL, unix.SYS_LOOKUP_DCOOKIE, unix.SYS_SYSLOG,
	unix.SYS_VHANGUP, unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_NFSSERVCTL, unix.SYS_USELIB,
	unix.SYS_SYSFS, unix.SYS__SYSCTL,
	// io_uring: its operations run in kernel workers that this filter
	// never sees, on a large attack surface (Docker's default denies it
	// too); programs that try it fall back to plain system calls.
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
}
