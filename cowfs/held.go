package cowfs

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// What a mount holds in memory for the names, inodes and xattrs a sandbox
// makes: a mounted branch keeps every inode it made or loaded until it is
// unmounted, so without a bound a sandbox could grow the server without
// limit (a million empty files, or 256 KiB of xattrs on each of many
// files, cost it nothing in the sandbox's own memory limit). The held
// count is what the branch's mount made, less what it removed; loading an
// existing tree is never refused (docs/limits.md).
const (
	// inodeHeld is what one inode is counted as, with its FUSE node:
	// more than the live heap an empty file made takes (1.1 KiB, 1.4 KiB
	// once committed; measured with 20,000 files).
	inodeHeld = 2 << 10
	// nameHeld is what one name costs beside its bytes (its map entry).
	nameHeld = 64
)

// Default held budgets, as fractions of the host's memory.
const (
	defaultHeldShare       = 3 // all branches together: a third of the memory
	defaultBranchHeldShare = 4 // one branch: a quarter
)

// heldBudgets returns the budgets of held bytes: the options' values, or
// shares of the memory this process may use where they are zero;
// negative means no bound (0).
func heldBudgets(all, branch int64) (int64, int64) {
	mem := memoryForProcess()
	return budget(all, mem/defaultHeldShare), budget(branch, mem/defaultBranchHeldShare)
}

// memoryForProcess is the host's memory, or the memory limit of this
// process's cgroup where that is lower (a daemon in a unit or a
// container with a memory bound).
func memoryForProcess() int64 {
	mem := int64(1) << 34 // 16 GiB, should the kernel not say
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil && si.Totalram > 0 {
		mem = int64(si.Totalram) * int64(max(si.Unit, 1))
	}
	b, _ := os.ReadFile("/proc/self/cgroup")
	return cgroupMemory(b, "/sys/fs/cgroup", mem)
}

// cgroupMemory returns mem, or the lowest memory limit of the cgroups
// that cgroups (the text of /proc/self/cgroup) names under the cgroup
// file system at sysfs, where one is lower.
func cgroupMemory(cgroups []byte, sysfs string, mem int64) int64 {
	for _, line := range strings.Split(string(cgroups), "\n") {
		// "0::/path" (v2) or "N:memory:/path" (v1)
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || strings.Contains(f[2], "..") {
			continue
		}
		var p string
		switch {
		case f[0] == "0" && f[1] == "":
			p = filepath.Join(sysfs, f[2], "memory.max")
		case slices.Contains(strings.Split(f[1], ","), "memory"):
			p = filepath.Join(sysfs, "memory", f[2], "memory.limit_in_bytes")
		default:
			continue
		}
		v, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64); err == nil && n > 0 && n < mem {
			mem = n // "max" (no bound) does not parse
		}
	}
	return mem
}

// hold counts n more held bytes against the branch's and the FS's held
// budgets, refusing with ENOSPC when they do not fit. Caller holds b.mu.
func (b *branch) hold(n int64) error {
	if max := b.fs.branchHeldBytes; max > 0 && n > 0 && b.held+n > max {
		return limitErr(syscall.ENOSPC, "branch %q: the names, inodes and xattrs made since it was mounted take %d bytes of the server's memory, at most %d", b.name, b.held, max)
	}
	if max := b.fs.heldBytes; max > 0 && n > 0 && b.fs.heldUsed.Load()+n > max {
		return limitErr(syscall.ENOSPC, "branch %q: the names, inodes and xattrs made in all mounted branches take %d bytes of the server's memory, at most %d", b.name, b.fs.heldUsed.Load(), max)
	}
	b.countHeld(n)
	return nil
}

// countHeld counts n held bytes (negative: given back) without a check,
// for what is never refused: removals, and a rename's longer name.
// Caller holds b.mu.
func (b *branch) countHeld(n int64) {
	b.held += n
	b.fs.heldUsed.Add(n)
}

// dropHeld gives back every byte the branch holds, when its tree is let
// go (unmount, rollback). Caller holds b.mu.
func (b *branch) dropHeld() { b.countHeld(-b.held) }

// nameCost is what a name costs held.
func nameCost(name string) int64 { return nameHeld + int64(len(name)) }

// inodeCost is what an inode costs held when it gets its first name: the
// inode with its symlink target. Its xattrs are counted as they are set.
func (in *inode) inodeCost() int64 { return inodeHeld + int64(len(in.target)) }
