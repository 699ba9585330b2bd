// Package procfs reads the processes and listening sockets of the agent's
// pid and network namespaces from /proc.
package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"tine/guestagent/proto"
)

// clockTicks is USER_HZ, the unit of the times in /proc/PID/stat; it is 100
// on every Linux architecture Go supports.
const clockTicks = 100

// FS reads one /proc mount.
type FS struct {
	// Root is the mount point, normally "/proc".
	Root string
	// Passwd is the file user names come from, normally "/etc/passwd".
	Passwd string

	once     sync.Once
	bootTime time.Time

	mu        sync.Mutex
	users     map[uint32]string
	passwdVer [2]int64 // mtime and size of Passwd when users was read
}

// Default reads /proc and /etc/passwd.
func Default() *FS { return &FS{Root: "/proc", Passwd: "/etc/passwd"} }

// PIDs lists the pids in /proc.
func (p *FS) PIDs() ([]int, error) {
	d, err := os.Open(p.Root)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	defer d.Close()
	var pids []int
	for {
		names, err := d.Readdirnames(1024)
		for _, n := range names {
			if pid, err := strconv.Atoi(n); err == nil && pid > 0 {
				pids = append(pids, pid)
			}
		}
		if err == io.EOF {
			return pids, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list processes in %s: %w", p.Root, err)
		}
	}
}

// List reads every process; those that exit while it reads are left out.
func (p *FS) List() ([]proto.Process, error) {
	pids, err := p.PIDs()
	if err != nil {
		return nil, err
	}
	procs := make([]proto.Process, 0, len(pids))
	for _, pid := range pids {
		pr, err := p.Process(pid)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			return nil, err
		}
		procs = append(procs, pr)
	}
	return procs, nil
}

var errGone = errors.New("process is gone")

// Process reads one process.
func (p *FS) Process(pid int) (proto.Process, error) {
	p.once.Do(p.load)
	dir := filepath.Join(p.Root, strconv.Itoa(pid))
	stat, err := readSmall(filepath.Join(dir, "stat"), 4096)
	if err != nil {
		return proto.Process{}, fmt.Errorf("read process %d: %w", pid, err)
	}
	pr, err := parseStat(pid, stat)
	if err != nil {
		return proto.Process{}, fmt.Errorf("read process %d: %s: %w", pid, filepath.Join(dir, "stat"), err)
	}
	pr.Start = p.bootTime.Add(pr.Start.Sub(time.Time{}))
	// The cmdline of a zombie is empty; that is not an error.
	cmdline, err := readSmall(filepath.Join(dir, "cmdline"), proto.MaxArgvBytes+1)
	if err == nil {
		pr.Argv, pr.ArgvTruncated = splitArgv(cmdline)
	}
	if status, err := readSmall(filepath.Join(dir, "status"), 16<<10); err == nil {
		pr.UID = statusUID(status)
	}
	pr.User = p.userName(pr.UID)
	if statm, err := readSmall(filepath.Join(dir, "statm"), 256); err == nil {
		f := strings.Fields(string(statm))
		if len(f) > 1 {
			pages, _ := strconv.ParseUint(f[1], 10, 64)
			pr.RSS = pages * uint64(os.Getpagesize())
		}
	}
	return pr, nil
}

// parseStat parses /proc/PID/stat; Start is left as the time since boot
// added to the zero time.
func parseStat(pid int, b []byte) (proto.Process, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return proto.Process{}, errors.New("no (comm) field")
	}
	f := strings.Fields(string(b[end+1:]))
	// After comm: state(3) ppid(4) ... utime(14) stime(15) ... starttime(22).
	if len(f) < 20 {
		return proto.Process{}, fmt.Errorf("%d fields after comm, want at least 20", len(f))
	}
	num := func(i int) uint64 { v, _ := strconv.ParseUint(f[i-3], 10, 64); return v }
	ticks := func(t uint64) time.Duration { return time.Duration(t) * (time.Second / clockTicks) }
	return proto.Process{
		PID:     pid,
		Comm:    string(b[open+1 : end]),
		State:   f[0],
		PPID:    int(num(4)),
		CPUTime: ticks(num(14) + num(15)),
		Start:   time.Time{}.Add(ticks(num(22))),
	}, nil
}

// splitArgv splits a NUL-separated command line.
func splitArgv(b []byte) ([]string, bool) {
	truncated := len(b) > proto.MaxArgvBytes
	if truncated {
		b = b[:proto.MaxArgvBytes]
	}
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil, truncated
	}
	return strings.Split(string(b), "\x00"), truncated
}

func statusUID(b []byte) uint32 {
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				v, _ := strconv.ParseUint(f[0], 10, 32)
				return uint32(v)
			}
		}
	}
	return 0
}

// readSmall reads at most limit bytes of a /proc file.
func readSmall(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		// A process that exits while it is read gives ESRCH.
		return nil, fmt.Errorf("%s: %w (%w)", path, err, errGone)
	}
	return b, nil
}

// load reads the boot time once.
func (p *FS) load() {
	if b, err := readSmall(filepath.Join(p.Root, "stat"), 1<<20); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "btime "); ok {
				s, _ := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
				p.bootTime = time.Unix(s, 0)
			}
		}
	}
}

// userName names uid from Passwd, which it reads again whenever it changed.
func (p *FS) userName(uid uint32) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.Open(p.Passwd)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	if ver := [2]int64{st.ModTime().UnixNano(), st.Size()}; p.users == nil || ver != p.passwdVer {
		p.users, p.passwdVer = readPasswd(f), ver
	}
	return p.users[uid]
}

// readPasswd maps uids to the first name /etc/passwd gives them.
func readPasswd(f io.Reader) map[uint32]string {
	users := map[uint32]string{}
	sc := bufio.NewScanner(io.LimitReader(f, 4<<20))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 4)
		if len(parts) < 3 {
			continue
		}
		if uid, err := strconv.ParseUint(parts[2], 10, 32); err == nil {
			if _, dup := users[uint32(uid)]; !dup {
				users[uint32(uid)] = parts[0]
			}
		}
	}
	return users
}
