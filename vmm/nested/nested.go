// Package nested runs commands inside a Linux machine that has real
// hardware virtualization, where the host has none usable: QEMU emulates
// an AMD CPU with SVM and nested paging in software (TCG), boots Debian's
// cloud kernel as the first-level guest (L1), loads kvm-amd there, and L1
// then offers a real /dev/kvm to whatever runs inside it, for instance
// tine's VMM booting a second-level Linux guest (L2).
//
// Run builds a static tine binary, packs it with busybox, the three KVM
// modules and the caller's files into L1's initramfs, boots QEMU, runs the
// caller's shell script in L1 once /dev/kvm exists, and returns what the
// script printed. Everything is bounded by a timeout; progress goes to a
// log function line by line. Timings inside L1 mean nothing (every
// instruction is emulated); correctness does.
package nested

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"tine/vmm/linux/kernels"
)

// Defaults of Options.
const (
	DefaultTimeout = 9 * time.Minute
	// DefaultSilence is how long L1's console may print nothing before
	// the run is taken for stalled: a whole run prints every few seconds.
	DefaultSilence = 3 * time.Minute
	DefaultMemory  = "3G"
	DefaultCPUs    = 2
	// TinePath is where the static tine binary is in L1.
	TinePath = "/bin/tine"
	// WorkDir is L1's working directory for the script; the caller's
	// files are placed relative to it unless their path is absolute.
	WorkDir = "/work"
)

// Markers L1's init prints on the serial console.
const (
	markerKVMReady = "TINE-NESTED: kvm ready"
	markerNoKVM    = "TINE-NESTED: no /dev/kvm"
	markerBegin    = "TINE-NESTED: begin"
	markerExit     = "TINE-NESTED: exit "
)

// ErrNoKVM is returned when L1 booted but /dev/kvm did not appear.
var ErrNoKVM = errors.New("nested: /dev/kvm did not appear in L1")

// ErrL1Stalled is returned when L1's kernel reported that a CPU made no
// progress (a soft lockup or an RCU stall), or its console printed nothing
// for Options.Silence: the emulator stalled, and the run was ended at once
// instead of waiting out its timeout.
var ErrL1Stalled = errors.New("nested: L1 stalled")

// l1Stall reports whether a line of L1's console is its kernel reporting
// a stalled CPU.
func l1Stall(line string) bool {
	return strings.Contains(line, "watchdog: BUG: soft lockup") || strings.Contains(line, "self-detected stall on CPU")
}

// ErrMissing is returned (wrapped) when a tool or file the harness needs is
// not on the host; tests skip on it.
var ErrMissing = errors.New("nested: missing on the host")

// File is a file put into L1's initramfs.
type File struct {
	// Path in L1; relative paths are under WorkDir.
	Path string
	// Data is the content; if nil, HostPath is read.
	Data     []byte
	HostPath string
	// Mode is the permission bits (default 0644; 0755 makes it runnable).
	Mode os.FileMode
}

// Options describe one nested run.
type Options struct {
	// Script is run by busybox sh in L1, in WorkDir, after /dev/kvm
	// appeared. Its standard output and error go to the console and are
	// returned by Run; its exit status decides Run's error.
	Script string
	// Files are added to L1's initramfs.
	Files []File
	// Timeout bounds the whole run, QEMU boot included (DefaultTimeout).
	Timeout time.Duration
	// Silence bounds a stretch with no console output (DefaultSilence).
	Silence time.Duration
	// Memory and CPUs size L1 (DefaultMemory, DefaultCPUs).
	Memory string
	CPUs   int
	// Log receives progress and L1's console, one line per call, e.g.
	// t.Log; nil for silence.
	Log func(format string, args ...any)
	// Kernels names the L1 kernel and its modules; nil uses kernels.Find.
	Kernels *kernels.Set
}

// Check reports whether the host has what Run needs: qemu-system-x86_64,
// busybox (static), the kernel files and the Go toolchain. Its error wraps
// ErrMissing and names what is missing.
func Check() error {
	_, err := prerequisites(nil)
	return err
}

type prereq struct {
	qemu, busybox, goTool string
	k                     *kernels.Set
}

func prerequisites(k *kernels.Set) (*prereq, error) {
	p := &prereq{k: k}
	var err error
	if p.qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		return nil, fmt.Errorf("%w: qemu-system-x86_64 (Debian package qemu-system-x86)", ErrMissing)
	}
	p.busybox = "/bin/busybox"
	if bb, err := exec.LookPath("busybox"); err == nil {
		p.busybox = bb
	}
	if err := checkStatic(p.busybox); err != nil {
		return nil, err
	}
	if p.goTool, err = exec.LookPath("go"); err != nil {
		return nil, fmt.Errorf("%w: the go command", ErrMissing)
	}
	if p.k == nil {
		if p.k, err = kernels.Find(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrMissing, err)
		}
	}
	return p, nil
}

// checkStatic makes sure the busybox binary has no ELF interpreter, since
// L1 has no shared libraries.
func checkStatic(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: static busybox (Debian package busybox-static): %w", ErrMissing, err)
	}
	if bytes.Contains(b[:min(len(b), 4096)], []byte("/lib64/ld-linux")) {
		return fmt.Errorf("%w: %s is dynamically linked; install Debian package busybox-static", ErrMissing, path)
	}
	return nil
}

// Result is what Run observed.
type Result struct {
	// Output is what the script printed (between the harness's markers).
	Output string
	// Console is L1's whole serial console.
	Console string
	// ExitCode is the script's exit status (-1 if it never finished).
	ExitCode int
}

// Run boots L1 under QEMU and runs opts.Script in it. It returns the
// script's output; the error is non-nil if the script failed, L1 had no
// /dev/kvm, QEMU failed, or the timeout or ctx ended the run.
func Run(ctx context.Context, opts Options) (*Result, error) {
	res := &Result{ExitCode: -1}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Silence == 0 {
		opts.Silence = DefaultSilence
	}
	if opts.Memory == "" {
		opts.Memory = DefaultMemory
	}
	if opts.CPUs == 0 {
		opts.CPUs = DefaultCPUs
	}
	logf := opts.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	start := time.Now()
	p, err := prerequisites(opts.Kernels)
	if err != nil {
		return res, err
	}

	dir, err := os.MkdirTemp("", "tine-nested-")
	if err != nil {
		return res, fmt.Errorf("nested: temp dir: %w", err)
	}
	defer os.RemoveAll(dir)

	logf("nested: building static tine")
	tineBin := filepath.Join(dir, "tine")
	build := exec.CommandContext(ctx, p.goTool, "build", "-o", tineBin, "tine/cmd/tine")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return res, fmt.Errorf("nested: go build tine/cmd/tine: %w\n%s", err, out)
	}

	logf("nested: packing L1 initramfs")
	initrd, err := l1Initramfs(p, tineBin, opts)
	if err != nil {
		return res, err
	}
	initrdPath := filepath.Join(dir, "l1.cpio.gz")
	if err := os.WriteFile(initrdPath, initrd, 0o644); err != nil {
		return res, fmt.Errorf("nested: write %s: %w", initrdPath, err)
	}
	logf("nested: L1 initramfs is %d MiB; booting QEMU (TCG, emulated SVM)", len(initrd)>>20)

	cmd := exec.CommandContext(ctx, p.qemu,
		"-accel", "tcg,thread=multi",
		"-cpu", "EPYC,+svm,+npt",
		"-smp", strconv.Itoa(opts.CPUs),
		"-m", opts.Memory,
		"-nographic", "-no-reboot",
		"-kernel", p.k.Vmlinuz,
		"-initrd", initrdPath,
		"-append", "console=ttyS0 panic=-1 quiet",
	)
	cmd.Stdin = nil
	cmd.WaitDelay = 5 * time.Second
	// QEMU ends with this process, even when the test binary ends
	// without cancelling ctx (its -timeout panics): an L1 left running
	// takes both cores from every later test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return res, fmt.Errorf("nested: qemu stdout: %w", err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("nested: start %s: %w", p.qemu, err)
	}
	var console strings.Builder
	var mu sync.Mutex
	var stalled atomic.Bool
	var why atomic.Value // what the stall was, for the error
	stall := func(what string) {
		if !stalled.Swap(true) {
			why.Store(what)
			cancel() // ends QEMU
		}
	}
	var lastLine atomic.Int64
	lastLine.Store(time.Now().UnixNano())
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lastLine.Store(time.Now().UnixNano())
			line := strings.TrimRight(sc.Text(), "\r")
			mu.Lock()
			console.WriteString(line + "\n")
			mu.Unlock()
			logf("[%5.0fs] %s", time.Since(start).Seconds(), line)
			if l1Stall(line) {
				stall("its kernel reported a stalled CPU")
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() {
		t := time.NewTicker(opts.Silence / 20)
		defer t.Stop()
		for {
			select {
			case <-scanDone:
				return
			case <-t.C:
				if quiet := time.Since(time.Unix(0, lastLine.Load())); quiet > opts.Silence {
					logf("nested: L1 printed nothing for %v; ending the run", quiet.Round(time.Second))
					stall(fmt.Sprintf("its console printed nothing for %v", opts.Silence))
				}
			}
		}
	}()
	<-scanDone
	waitErr := cmd.Wait()
	mu.Lock()
	res.Console = console.String()
	mu.Unlock()
	logf("nested: QEMU ended after %v", time.Since(start).Round(time.Second))

	out, code, finished := scriptOutput(res.Console)
	res.Output, res.ExitCode = out, code
	switch {
	case finished && code == 0:
		return res, nil
	case finished:
		return res, fmt.Errorf("nested: script exited with status %d", code)
	case strings.Contains(res.Console, markerNoKVM):
		return res, ErrNoKVM
	case stalled.Load():
		return res, fmt.Errorf("%w: %s", ErrL1Stalled, why.Load())
	case ctx.Err() != nil:
		return res, fmt.Errorf("nested: run did not finish within %v: %w", opts.Timeout, ctx.Err())
	case waitErr != nil:
		return res, fmt.Errorf("nested: qemu: %w: %s", waitErr, strings.TrimSpace(stderr.String()))
	default:
		return res, fmt.Errorf("nested: L1 stopped before the script finished: %s", strings.TrimSpace(stderr.String()))
	}
}

// scriptOutput cuts the script's output out of the console and parses its
// exit status.
func scriptOutput(console string) (out string, code int, finished bool) {
	_, after, ok := strings.Cut(console, markerBegin+"\n")
	if !ok {
		return "", -1, false
	}
	i := strings.LastIndex(after, markerExit)
	if i < 0 {
		return after, -1, false
	}
	rest := after[i+len(markerExit):]
	if nl := strings.IndexByte(rest, '\n'); nl >= 0 {
		rest = rest[:nl]
	}
	code, err := strconv.Atoi(strings.TrimSpace(rest))
	if err != nil {
		return after[:i], -1, false
	}
	return after[:i], code, true
}

// l1Init is L1's /init: mount the kernel filesystems, load the KVM
// modules in dependency order, and tun (for TAP devices) and fuse (for
// cowfs mounts, /dev/fuse) when they are there, then run the caller's
// script.
const l1Init = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
echo "TINE-NESTED: L1 up, $(nproc) CPUs, kernel $(uname -r)"
for m in irqbypass kvm kvm-amd; do
	insmod /lib/modules/$m.ko || echo "TINE-NESTED: insmod $m failed"
done
# TAP devices for the vm runtime's networks, where the kernel cache has tun.
if [ -e /lib/modules/tun.ko ]; then
	insmod /lib/modules/tun.ko || echo "TINE-NESTED: insmod tun failed"
fi
# FUSE for cowfs mounts (the Manager's project branches), where the
# kernel cache has fuse: loading it makes /dev/fuse.
if [ -e /lib/modules/fuse.ko ]; then
	insmod /lib/modules/fuse.ko || echo "TINE-NESTED: insmod fuse failed"
	[ -e /dev/fuse ] || mknod /dev/fuse c 10 229
fi
if [ -e /dev/kvm ]; then
	echo "` + markerKVMReady + `"
	cd ` + WorkDir + `
	echo "` + markerBegin + `"
	sh ./run.sh 2>&1
	echo "` + markerExit + `$?"
else
	echo "` + markerNoKVM + `"
	grep -c svm /proc/cpuinfo
fi
sync
poweroff -f
`

func l1Initramfs(p *prereq, tineBin string, opts Options) ([]byte, error) {
	var a Archive
	for _, d := range []string{"dev", "proc", "sys", "tmp", "sbin", "lib/modules", WorkDir} {
		a.Dir(d)
	}
	add := func(name string, mode os.FileMode, hostPath string) error {
		b, err := os.ReadFile(hostPath)
		if err != nil {
			return fmt.Errorf("nested: read %s for L1 %s: %w", hostPath, name, err)
		}
		a.File(name, mode, b)
		return nil
	}
	if err := add("bin/busybox", 0o755, p.busybox); err != nil {
		return nil, err
	}
	if err := add(TinePath, 0o755, tineBin); err != nil {
		return nil, err
	}
	mods := []struct{ name, host string }{{"irqbypass", p.k.Irqbypass}, {"kvm", p.k.KVM}, {"kvm-amd", p.k.KVMAMD}}
	if p.k.Tun != "" {
		mods = append(mods, struct{ name, host string }{"tun", p.k.Tun})
	}
	if fuse := filepath.Join(p.k.Dir, "fuse.ko"); fileExists(fuse) {
		mods = append(mods, struct{ name, host string }{"fuse", fuse})
	}
	for _, m := range mods {
		if err := add("lib/modules/"+m.name+".ko", 0o644, m.host); err != nil {
			return nil, err
		}
	}
	a.File("init", 0o755, []byte(l1Init))
	a.File(filepath.Join(WorkDir, "run.sh"), 0o755, []byte(opts.Script))
	for _, f := range opts.Files {
		name := f.Path
		if !filepath.IsAbs(name) {
			name = filepath.Join(WorkDir, name)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if f.Data != nil {
			a.File(name, mode, f.Data)
		} else if err := add(name, mode, f.HostPath); err != nil {
			return nil, err
		}
	}
	return a.Gzip()
}

// fileExists reports whether path names a file that can be read.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// EnvEnable names the environment variable that turns nested runs on in
// tests: a run takes minutes, so `make nested-test` sets it and plain
// `go test` skips them.
const EnvEnable = "TINE_NESTED"

// RunTest is Run for tests: it skips t when EnvEnable is unset or the host
// lacks what a run needs, logs progress to t, fails t on any error, and
// returns the script's output.
func RunTest(ctx context.Context, t testing.TB, opts Options) string {
	t.Helper()
	if os.Getenv(EnvEnable) == "" {
		t.Skipf("nested QEMU runs take minutes: set %s=1 (make nested-test) to run them", EnvEnable)
	}
	if err := Check(); err != nil {
		t.Skipf("%v", err)
	}
	if opts.Log == nil {
		opts.Log = t.Logf
	}
	res, err := Run(ctx, opts)
	if errors.Is(err, ErrL1Stalled) {
		// A stall of the emulator's CPU is not tine's; a second one is
		// reported as a failure.
		t.Logf("FLAKY in QEMU: %v; running the whole nested run once more", err)
		res, err = Run(ctx, opts)
	}
	if err != nil {
		t.Fatalf("%v\nscript output:\n%s", err, res.Output)
	}
	return res.Output
}
