package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"tine/vmm/linux"
)

func runVMBoot(ctx context.Context, o *vmOpts, args []string, stdout io.Writer) error {
	kernel, initrd, cmdline, mem, cpus, input := &o.kernel, &o.initrd, &o.cmdline, &o.mem, &o.cpus, &o.input
	if *kernel == "" {
		return usageErr("vm boot --kernel FILE [--initrd FILE] [--cmdline TEXT] [--mem SIZE] [--cpus N]")
	}
	memSize, err := parseSize(*mem)
	if err == nil && memSize == 0 {
		err = fmt.Errorf("bad size %q", *mem)
	}
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
		Kernel: k, Initrd: rd, Cmdline: *cmdline, MemSize: uint64(memSize), VCPUs: *cpus, Console: stdout,
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
