package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tine/api"
	"tine/sandbox"
)

// limitFlags are the limit flags of create and update, as typed.
type limitFlags struct {
	f                                 *pflag.FlagSet
	cpus                              float64
	pids                              int64
	memory, disk, tmpfs, layer        string
	ioRead, ioWrite, ioRIOPS, ioWIOPS string
	lifetime, idle                    time.Duration
	gpu                               bool
	devices                           []string
	// pidsDisk says bind added --pids and --disk: a command that has its
	// own (create) sets those limits itself.
	pidsDisk bool
}

// bind adds the limit flags to f; withPidsDisk adds --pids and --disk
// too (create has its own).
func (lf *limitFlags) bind(f *pflag.FlagSet, withPidsDisk bool) {
	lf.f, lf.pidsDisk = f, withPidsDisk
	f.Float64Var(&lf.cpus, "cpus", 0, "CPU time per second, in CPUs, such as 0.5 or 2 (0: no limit)")
	f.StringVar(&lf.memory, "memory", "", "most memory, tmpfs files included, such as 512M or 4G (0: no limit); over it a process of this sandbox is killed")
	f.StringVar(&lf.tmpfs, "tmpfs", "", "size of each of /tmp, /run and /dev/shm (default 512M; fixed at start)")
	f.StringVar(&lf.layer, "layer", "", "disk space of the OS layer (writes outside the project), such as 20G (default 10G); a sandbox found over it is frozen")
	f.StringVar(&lf.ioRead, "io-read-bps", "", "read bytes per second from the host's disks, such as 50M (0: no limit)")
	f.StringVar(&lf.ioWrite, "io-write-bps", "", "written bytes per second, such as 20M (0: no limit)")
	f.StringVar(&lf.ioRIOPS, "io-read-iops", "", "read operations per second (0: no limit)")
	f.StringVar(&lf.ioWIOPS, "io-write-iops", "", "write operations per second (0: no limit)")
	f.DurationVar(&lf.lifetime, "lifetime", 0, "remove the sandbox this long after it was created, such as 30m (0: never)")
	f.DurationVar(&lf.idle, "idle", 0, "freeze the sandbox once it ran no command and used no CPU for this long, such as 5m (0: never); a command thaws it")
	f.BoolVar(&lf.gpu, "gpu", false, "pass the host's NVIDIA GPUs through, with the driver's libraries read-only (at start)")
	f.StringArrayVar(&lf.devices, "device", nil, "host device node to pass through at the same path, such as /dev/dri/renderD128 (repeatable; at start)")
	if withPidsDisk {
		f.Int64Var(&lf.pids, "pids", 0, "most processes at once (0: no limit)")
		f.StringVar(&lf.disk, "disk", "", "most bytes written to the project, such as 512M or 1G (0: no limit)")
	}
}

// apply sets in l the limits whose flags were given.
func (lf *limitFlags) apply(l *sandbox.Limits) error {
	size := func(flag, s string, into *int64) error {
		if !lf.f.Changed(flag) || flag == "disk" && !lf.pidsDisk {
			return nil
		}
		n, err := parseSize(s)
		if err != nil {
			return usageErr("--%s: %v", flag, err)
		}
		*into = n
		return nil
	}
	count := func(flag, s string, into *int64) error {
		if !lf.f.Changed(flag) {
			return nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return usageErr("--%s %q: want a whole number, 0 or more", flag, s)
		}
		*into = n
		return nil
	}
	for _, e := range []error{
		size("memory", lf.memory, &l.MemoryBytes), size("tmpfs", lf.tmpfs, &l.TmpfsBytes), size("layer", lf.layer, &l.LayerBytes),
		size("io-read-bps", lf.ioRead, &l.IOReadBPS), size("io-write-bps", lf.ioWrite, &l.IOWriteBPS),
		count("io-read-iops", lf.ioRIOPS, &l.IOReadIOPS), count("io-write-iops", lf.ioWIOPS, &l.IOWriteIOPS),
		size("disk", lf.disk, &l.ProjectBytes),
	} {
		if e != nil {
			return e
		}
	}
	if lf.f.Changed("cpus") {
		l.CPUs = lf.cpus
	}
	if lf.f.Changed("pids") && lf.pidsDisk {
		l.Pids = lf.pids
	}
	if lf.f.Changed("gpu") {
		l.GPU = lf.gpu
	}
	if lf.f.Changed("device") {
		l.Devices = lf.devices
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
		into *time.Duration
	}{{"lifetime", lf.lifetime, &l.Lifetime}, {"idle", lf.idle, &l.Idle}} {
		if !lf.f.Changed(d.flag) {
			continue
		}
		if d.v < 0 {
			return usageErr("--%s %s: want a duration of 0 (never) or more, such as 30m", d.flag, d.v)
		}
		*d.into = d.v
	}
	if err := l.Check(); err != nil {
		return usageErr("%v", err)
	}
	return nil
}

func (a *app) updateCommand() *cobra.Command {
	var lf limitFlags
	c := &cobra.Command{
		Use:   "update SB [--memory 4G] [--cpus 2] [--pids N] ...",
		Short: "change the limits of a sandbox; a running one gets them at once",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := c.Context()
			cl, err := a.daemon(ctx)
			if err != nil {
				return err
			}
			cur, err := cl.Limits(ctx, args[0])
			if err != nil {
				return sbErr(args[0], err)
			}
			l := cur.Limits
			if err := lf.apply(&l); err != nil {
				return err
			}
			resp, err := cl.UpdateLimits(ctx, args[0], l)
			if err != nil {
				return sbErr(args[0], err)
			}
			return a.printLimits(args[0], resp)
		},
	}
	lf.bind(c.Flags(), true)
	return c
}

func (a *app) limitsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "limits SB",
		Short: "show a sandbox's limits and what it uses now",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			resp, err := cl.Limits(c.Context(), args[0])
			if err != nil {
				return sbErr(args[0], err)
			}
			return a.printLimits(args[0], resp)
		},
	}
}

func (a *app) printLimits(name string, r *api.LimitsResponse) error {
	if a.json {
		return writeJSON(a.stdout, r)
	}
	w := a.stdout
	l := r.Limits
	opt := func(n int64, f func(int64) string) string {
		if n == 0 {
			return "no limit"
		}
		return f(n)
	}
	hb := func(n int64) string { return humanBytes(n) }
	ps := func(n int64) string { return humanBytes(n) + "/s" }
	num := func(n int64) string { return strconv.FormatInt(n, 10) }
	dur := func(d time.Duration) string {
		if d == 0 {
			return "none"
		}
		return d.String()
	}
	cpus := "no limit"
	if l.CPUs > 0 {
		cpus = strconv.FormatFloat(l.CPUs, 'g', -1, 64)
	}
	tmpfs := l.TmpfsBytes
	if tmpfs == 0 {
		tmpfs = sandbox.DefaultTmpfsBytes
	}
	fmt.Fprintf(w, "sandbox     %s\n", name)
	fmt.Fprintf(w, "cpus        %s\n", cpus)
	fmt.Fprintf(w, "memory      %s\n", opt(l.MemoryBytes, hb))
	fmt.Fprintf(w, "pids        %s\n", opt(l.Pids, num))
	fmt.Fprintf(w, "disk        %s (project)\n", opt(l.ProjectBytes, hb))
	fmt.Fprintf(w, "tmpfs       %s each (/tmp, /run, /dev/shm)\n", humanBytes(tmpfs))
	layer := l.LayerBytes
	if layer == 0 {
		layer = sandbox.DefaultLayerBytes
	}
	fmt.Fprintf(w, "OS layer    %s\n", humanBytes(layer))
	fmt.Fprintf(w, "io          read %s, write %s, read %s iops, write %s iops\n",
		opt(l.IOReadBPS, ps), opt(l.IOWriteBPS, ps), opt(l.IOReadIOPS, num), opt(l.IOWriteIOPS, num))
	if l.GPU || len(l.Devices) > 0 {
		fmt.Fprintf(w, "devices     gpu %v %s\n", l.GPU, strings.Join(l.Devices, " "))
	}
	fmt.Fprintf(w, "lifetime    %s\n", dur(l.Lifetime))
	fmt.Fprintf(w, "idle        %s\n", dur(l.Idle))
	if r.Frozen != "" {
		fmt.Fprintf(w, "frozen      %s (tine thaw %s)\n", r.Frozen, name)
	}
	if u := r.Usage; u != nil {
		fmt.Fprintf(w, "using       cpu %v, memory %s (peak %s), %d tasks, %d OOM kills",
			time.Duration(u.CPUNanos).Round(time.Millisecond), humanBytes(int64(u.MemoryBytes)),
			humanBytes(int64(u.MemoryPeak)), u.Pids, u.OOMKills)
		if u.LayerBytes > 0 {
			fmt.Fprintf(w, ", OS layer %s", humanBytes(u.LayerBytes))
		}
		fmt.Fprintln(w)
	}
	return nil
}
