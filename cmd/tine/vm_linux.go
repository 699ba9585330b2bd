package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"tine/vmm/linux"
)

func init() {
	register(command{name: "vm boot", summary: "boot a Linux kernel with its serial console on stdout", run: runVMBoot})
}

func runVMBoot(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("vm boot")
	kernel := fs.String("kernel", "", "kernel: a bzImage, or an uncompressed vmlinux booted through PVH (required)")
	initrd := fs.String("initrd", "", "initial ramdisk")
	cmdline := fs.String("cmdline", "console=ttyS0 panic=-1", "kernel command line")
	mem := fs.String("mem", "512M", "guest RAM, with an optional K, M or G suffix (at most 3G)")
	cpus := fs.Int("cpus", 1, "number of vCPUs")
	input := fs.Bool("input", false, "forward standard input to the guest's serial port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kernel == "" || fs.NArg() != 0 {
		return usageErr("vm boot --kernel FILE [--initrd FILE] [--cmdline TEXT] [--mem SIZE] [--cpus N]")
	}
	memSize, err := parseSize(*mem)
	if err != nil {
		return usageErr("--mem: %v", err)
	}
	if err := noNewPrivs(); err != nil {
		return err
	}
	k, err := os.ReadFile(*kernel)
	if err != nil {
		return fmt.Errorf("read kernel: %w", err)
	}
	var rd []byte
	if *initrd != "" {
		if rd, err = os.ReadFile(*initrd); err != nil {
			return fmt.Errorf("read initrd: %w", err)
		}
	}
	m, err := linux.NewMachine(ctx, linux.MachineConfig{
		Kernel: k, Initrd: rd, Cmdline: *cmdline, MemSize: memSize, VCPUs: *cpus, Console: stdout,
	})
	if err != nil {
		return fmt.Errorf("kernel %s: %w", *kernel, err)
	}
	defer m.Close()
	if *input {
		go func() {
			buf := make([]byte, 256)
			for {
				n, err := os.Stdin.Read(buf)
				for b := buf[:n]; len(b) > 0; {
					kept := m.UART.Receive(b)
					if kept == 0 {
						time.Sleep(10 * time.Millisecond) // the guest is not reading
					}
					b = b[kept:]
				}
				if err != nil {
					return
				}
			}
		}()
	}
	if err := m.Run(ctx); err != nil {
		if ctx.Err() != nil {
			// Stopped from outside: say where each vCPU was, which is
			// what one needs to find a guest that hangs.
			for _, c := range m.VM.VCPUs() {
				if r, rerr := c.Regs(); rerr == nil {
					fmt.Fprintf(os.Stderr, "tine vm boot: vCPU %d stopped at rip %#x rsp %#x rflags %#x\n", c.ID(), r.RIP, r.RSP, r.RFLAGS)
				}
			}
		}
		return fmt.Errorf("kernel %s: %w", *kernel, err)
	}
	return nil
}

// parseSize parses a byte count with an optional K, M or G suffix (powers
// of 1024).
func parseSize(s string) (uint64, error) {
	mult := uint64(1)
	switch {
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		mult = 1 << 10
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		mult = 1 << 20
	case strings.HasSuffix(s, "G"), strings.HasSuffix(s, "g"):
		mult = 1 << 30
	}
	num := s
	if mult != 1 {
		num = s[:len(s)-1]
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n == 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}
