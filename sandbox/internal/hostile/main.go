// Command hostile makes, from inside a sandbox, the system calls a
// sandbox must not be able to make, for the sandbox tests. Each attempt
// prints one line: "blocked WHAT: ERROR" when the kernel refused it, or
// "ESCAPED WHAT" when it went through.
package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func report(what string, err error) {
	if err != nil {
		fmt.Printf("blocked %s: %v\n", what, err)
	} else {
		fmt.Printf("ESCAPED %s\n", what)
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hostile syscalls | ptrace PID | kill PID | euid | listen PORT | hog MIB | initstep")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "syscalls":
		syscalls()
	case "ptrace":
		pid, _ := strconv.Atoi(os.Args[2])
		err := unix.PtraceAttach(pid)
		if err == nil {
			unix.PtraceDetach(pid)
		}
		report("ptrace attach to pid "+os.Args[2], err)
	case "kill":
		pid, _ := strconv.Atoi(os.Args[2])
		report("kill -0 of pid "+os.Args[2], unix.Kill(pid, 0))
	case "euid":
		fmt.Printf("uid %d euid %d\n", unix.Getuid(), unix.Geteuid())
		report("setuid(0) after a setuid exec", unix.Setuid(0))
	case "listen":
		l, err := net.Listen("tcp", "127.0.0.1:"+os.Args[2])
		if err != nil {
			fmt.Println("listen:", err)
			os.Exit(1)
		}
		fmt.Println("listening")
		host, _ := os.Hostname()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "hello from %s\n", host)
			c.Close()
		}
	case "connect":
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+os.Args[2], 2*time.Second)
		if err != nil {
			fmt.Println("connect:", err)
			os.Exit(1)
		}
		b := make([]byte, 100)
		n, _ := c.Read(b)
		fmt.Print(string(b[:n]))
	case "initstep":
		initStep()
	case "hog":
		mib, _ := strconv.Atoi(os.Args[2])
		var keep [][]byte
		for i := 0; i < mib; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			keep = append(keep, b)
		}
		fmt.Printf("held %d MiB\n", len(keep))
	}
}

// syscalls tries each call the sandbox's seccomp filter and capability
// set are there to stop.
func syscalls() {
	// open_by_handle_at: a handle forged for inode 2 (a root directory on
	// ext4 and most others) on the root's file system.
	root, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == nil {
		h := unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
		fd, err := unix.OpenByHandleAt(root, h, unix.O_RDONLY)
		if err == nil {
			unix.Close(fd)
		}
		report("open_by_handle_at with a forged handle", err)
		_, _, err = unix.NameToHandleAt(root, "etc", 0)
		report("name_to_handle_at", err)
		unix.Close(root)
	}
	report("mount tmpfs", unix.Mount("tmpfs", "/mnt", "tmpfs", 0, ""))
	report("unshare a mount namespace", unix.Unshare(unix.CLONE_NEWNS))
	report("unshare a user namespace", unix.Unshare(unix.CLONE_NEWUSER))
	report("chroot", unix.Chroot("/tmp"))
	for _, ns := range []string{"mnt", "pid", "net", "user", "cgroup"} {
		fd, err := unix.Open("/proc/1/ns/"+ns, unix.O_RDONLY, 0)
		if err != nil {
			report("open /proc/1/ns/"+ns, err)
			continue
		}
		report("setns to /proc/1/ns/"+ns, unix.Setns(fd, 0))
		unix.Close(fd)
	}
	report("init_module", initModule())
	if fd, err := unix.Open("/dev/null", unix.O_RDONLY, 0); err == nil {
		report("finit_module", unix.FinitModule(fd, "", 0))
		unix.Close(fd)
	}
	report("delete_module", unix.DeleteModule("loop", 0))
	if fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0); err == nil {
		unix.Close(fd)
		report("socket(AF_PACKET, SOCK_RAW)", nil)
	} else {
		report("socket(AF_PACKET, SOCK_RAW)", err)
	}
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP); err == nil {
		unix.Close(fd)
		report("socket(AF_INET, SOCK_RAW)", nil)
	} else {
		report("socket(AF_INET, SOCK_RAW)", err)
	}
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_REALTIME, &ts)
	report("clock_settime", unix.ClockSettime(unix.CLOCK_REALTIME, &ts))
	tv := unix.NsecToTimeval(ts.Nano())
	report("settimeofday", unix.Settimeofday(&tv))
	report("mknod a block device", unix.Mknod("/tmp/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	report("iopl(3)", iopl())
	_, _, e := unix.Syscall(unix.SYS_BPF, 0, 0, 0)
	report("bpf", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0)
	report("userfaultfd", errnoErr(e))
	var params [120]byte // struct io_uring_params
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if e == 0 {
		unix.Close(int(fd))
	}
	report("io_uring_setup", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_KEXEC_LOAD, 0, 0, 0)
	report("kexec_load", errnoErr(e))
	report("reboot", unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF))
	report("sethostname to a host-visible name", sethostnameOutside())
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func initModule() error {
	img := []byte("\x7fELF not a module")
	_, _, e := unix.Syscall(unix.SYS_INIT_MODULE, uintptr(unsafe.Pointer(&img[0])), uintptr(len(img)), uintptr(unsafe.Pointer(&[]byte{0}[0])))
	return errnoErr(e)
}

func iopl() error {
	_, _, e := unix.Syscall(unix.SYS_IOPL, 3, 0, 0)
	return errnoErr(e)
}

// sethostnameOutside checks that the sandbox's uts namespace is its own:
// changing the host name inside must not change the host's (the test
// compares); it reports the call's own result as blocked when it fails.
func sethostnameOutside() error {
	if err := unix.Sethostname([]byte("tine-hostile-renamed")); err != nil {
		return err
	}
	return fmt.Errorf("allowed inside the sandbox's own uts namespace; the test checks the host name")
}

// initStep runs the agent binary bound in the sandbox as a sandbox's
// init step, with a config asking for a new root and host name: it must
// fail (exit 125) without building anything.
func initStep() {
	const what = "run /run/tine-agent as an init step"
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		fmt.Println("socketpair:", err)
		os.Exit(1)
	}
	for _, d := range []string{"/tmp/is-root", "/tmp/is-upper", "/tmp/is-work"} {
		os.MkdirAll(d, 0o755)
	}
	cfg := `{"Root":"/tmp/is-root","Upper":"/tmp/is-upper","Work":"/tmp/is-work","ProjectPath":"/tmp/is-p",` +
		`"ProjectSource":"/","RunDir":"/tmp","Agent":"/run/tine-agent","Hostname":"tine-hostile-renamed","TmpfsBytes":1048576}`
	if _, err := unix.Write(fds[0], []byte(cfg)); err != nil {
		fmt.Println("send config:", err)
		os.Exit(1)
	}
	ctl := os.NewFile(uintptr(fds[1]), "ctl")
	null, _ := os.Open(os.DevNull)
	var out strings.Builder
	cmd := exec.Command("/run/tine-agent")
	cmd.Env = []string{"TINE_SANDBOX_INIT=1"}
	cmd.ExtraFiles = []*os.File{ctl, null}
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	host, _ := os.Hostname()
	switch {
	case host == "tine-hostile-renamed":
		report(what+" (the host name changed)", nil)
	case cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 125:
		report(what, fmt.Errorf("%s", strings.TrimSpace(out.String())))
	default:
		report(what+fmt.Sprintf(" (%v: %s)", err, strings.TrimSpace(out.String())), nil)
	}
}
