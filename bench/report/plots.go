package main

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"tine/bench/internal/vmrun"
)

// plotRef is one figure of the report: its file, or why it is missing.
type plotRef struct {
	title, file, missing string
}

// palette gives each tool the same colour in every figure.
var palette = map[string]color.Color{
	"tine":            color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"tine pool":       color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	"tine, /dev/fuse": color.RGBA{R: 0xf7, G: 0xa6, B: 0xa6, A: 0xff},
	"ext4":            color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"native":          color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"btrfs":           color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"overlayfs":       color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	"fuse-overlayfs":  color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	"cp -a":           color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	"git":             color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff},
}

func toolColor(t string) color.Color {
	if c, ok := palette[t]; ok {
		return c
	}
	return color.Black
}

// drawPlots draws every figure it has data for into dir.
func drawPlots(rep *report, dir string) ([]plotRef, error) {
	var refs []plotRef
	add := func(title, file string, draw func(string) (string, error)) error {
		missing, err := draw(filepath.Join(dir, file))
		if err != nil {
			return fmt.Errorf("plot %s: %w", file, err)
		}
		if missing != "" {
			refs = append(refs, plotRef{title: title, missing: missing})
		} else {
			refs = append(refs, plotRef{title: title, file: file})
		}
		return nil
	}
	agent := rep.sectionByPrefix("Agent workloads")
	if err := add("Agent workloads against ext4 (ratio of medians, log scale; 1 = native)", "agent-vs-native.svg",
		func(p string) (string, error) { return plotAgentRatios(agent, p) }); err != nil {
		return nil, err
	}
	if err := add("Latency CDF of lstat, every file of the project (warm)", "stat-latency-cdf.svg",
		func(p string) (string, error) { return plotCDF(agent.rowByPrefix("stat every file"), p) }); err != nil {
		return nil, err
	}
	snap := rep.sectionByPrefix("Snapshot and fork")
	if err := add("Snapshot latency against tree size", "snapshot-vs-size.svg",
		func(p string) (string, error) { return plotVsSize(snap, "snapshot, synth ", p, "snapshot") }); err != nil {
		return nil, err
	}
	if err := add("Fork of a filesystem branch against tree size", "fork-vs-size.svg",
		func(p string) (string, error) { return plotVsSize(snap, "fork, synth ", p, "fork") }); err != nil {
		return nil, err
	}
	diff := rep.sectionByPrefix("Diff latency")
	if err := add("Diff latency against the number of changes", "diff-vs-changes.svg",
		func(p string) (string, error) { return plotDiff(diff, p) }); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		title, file string
		draw        func(*vmrun.Run, string) (string, error)
	}{
		{"VM fork latency against guest RAM (fork to first guest instruction)", "vm-fork-vs-ram.svg", plotVMRAM},
		{"VM fork latency against fan-out (all children at their first instruction)", "vm-fork-vs-fanout.svg", plotVMFanOut},
		{"Latency CDF of VM forks, smallest RAM size", "vm-fork-cdf.svg", plotVMCDF},
	} {
		if err := add(f.title, f.file, func(p string) (string, error) {
			if rep.VM == nil {
				return vmMissing(), nil
			}
			return f.draw(rep.VM, p)
		}); err != nil {
			return nil, err
		}
	}
	return refs, nil
}

func vmMissing() string {
	if kvmOK() {
		return "not drawn: /dev/kvm is present, but the report was given no results of bench/vmm (`make bench` saves them and passes `--vmm`)."
	}
	return "not drawn: this machine has no /dev/kvm, so bench/vmm cannot fork a VM here, and no number is shown in its place."
}

// vmColors tells the start methods of bench/vmm apart.
var vmColors = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
}

// vmMethods lists the run's methods in the order first measured.
func vmMethods(vr *vmrun.Run) []string {
	var ms []string
	for _, f := range vr.Forks {
		if !slices.Contains(ms, f.Method) {
			ms = append(ms, f.Method)
		}
	}
	return ms
}

func vmColor(i int) color.Color { return vmColors[i%len(vmColors)] }

func plotVMRAM(vr *vmrun.Run, path string) (string, error) {
	p := newPlot("VM start: median latency against guest RAM ("+vr.KVM+")", "guest RAM (log)", "median latency (ms, log)")
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	var ticks []plot.Tick
	top := 0.0
	for _, f := range vr.Forks {
		x := float64(f.RAM) / (1 << 30)
		if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == x }) {
			ticks = append(ticks, plot.Tick{Value: x, Label: ramLabel(f.RAM)})
		}
		top = math.Max(top, f.Quantile(0.5)*1e3)
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Max = top * 40 // room above the curves for the legend
	drawn := 0
	for i, m := range vmMethods(vr) {
		var pts plotter.XYs
		for _, f := range vr.Forks {
			if q := f.Quantile(0.5); f.Method == m && q > 0 {
				pts = append(pts, plotter.XY{X: float64(f.RAM) / (1 << 30), Y: q * 1e3})
			}
		}
		ok, err := addSeries(p, m, pts, vmColor(i))
		if err != nil {
			return "", err
		}
		if ok {
			drawn++
		}
	}
	if drawn == 0 {
		return "not drawn: the VM results hold no fork latencies", nil
	}
	p.Legend.Top, p.Legend.Left = true, true
	return "", p.Save(22*vg.Centimeter, 14*vg.Centimeter, path)
}

// ramLabel writes a RAM size as 256 MiB or 4 GiB.
func ramLabel(b uint64) string {
	if b >= 1<<30 && b%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", b>>30)
	}
	return fmt.Sprintf("%d MiB", b>>20)
}

func plotVMFanOut(vr *vmrun.Run, path string) (string, error) {
	if len(vr.FanOut) == 0 {
		return "not drawn: the VM results hold no fan-out", nil
	}
	p := newPlot("VM fork fan-out ("+vr.KVM+")", "children forked at once (log)", "latency (ms, log)")
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	for _, f := range vr.FanOut {
		p.Y.Max = math.Max(p.Y.Max, f.Answered*1e3*20) // room above the curves for the legend
	}
	for i, c := range []struct {
		name string
		y    func(vmrun.FanOut) float64
	}{
		{"all children forked", func(f vmrun.FanOut) float64 { return f.Forked }},
		{"all at their first instruction", func(f vmrun.FanOut) float64 { return f.Answered }},
		{"per child (all answered / children)", func(f vmrun.FanOut) float64 { return f.Answered / float64(f.Children) }},
	} {
		var pts plotter.XYs
		for _, f := range vr.FanOut {
			if y := c.y(f); f.Children > 0 && y > 0 {
				pts = append(pts, plotter.XY{X: float64(f.Children), Y: y * 1e3})
			}
		}
		if _, err := addSeries(p, c.name, pts, vmColor(i)); err != nil {
			return "", err
		}
	}
	p.Legend.Top, p.Legend.Left = true, true
	return "", p.Save(16*vg.Centimeter, 11*vg.Centimeter, path)
}

func plotVMCDF(vr *vmrun.Run, path string) (string, error) {
	var smallest uint64
	for _, f := range vr.Forks {
		if smallest == 0 || f.RAM < smallest {
			smallest = f.RAM
		}
	}
	p := newPlot(fmt.Sprintf("VM start latency CDF, %d MiB guest (%s)", smallest>>20, vr.KVM), "latency (ms, log)", "fraction of starts")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	drawn := 0
	for i, m := range vmMethods(vr) {
		for _, f := range vr.Forks {
			if f.Method != m || f.RAM != smallest || len(f.Samples) < 2 {
				continue
			}
			s := slices.Clone(f.Samples)
			slices.Sort(s)
			pts := make(plotter.XYs, len(s))
			for j, x := range s {
				pts[j] = plotter.XY{X: math.Max(x*1e3, 1e-3), Y: float64(j+1) / float64(len(s))}
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return "", err
			}
			l.Color = vmColor(i)
			l.Width = vg.Points(1.5)
			p.Add(l)
			p.Legend.Add(m, l)
			drawn++
		}
	}
	if drawn == 0 {
		return "not drawn: the VM results hold no fork samples", nil
	}
	p.Legend.Top, p.Legend.Left = false, false
	return "", p.Save(22*vg.Centimeter, 14*vg.Centimeter, path)
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	return p
}

func plotAgentRatios(s *section, path string) (string, error) {
	if s == nil {
		return "not drawn: the agent section did not run", nil
	}
	peers := []string{"tine", "tine, /dev/fuse", "btrfs", "overlayfs", "fuse-overlayfs"}
	var names []string
	var rows []*row
	for _, r := range s.Rows {
		if r.rate() || !r.Results["ext4"].ok() {
			continue
		}
		names = append(names, shortName(r.Name))
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return "not drawn: no agent row has an ext4 value", nil
	}
	p := newPlot("Agent workloads: median / ext4 median", "", "ratio to ext4 (log)")
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	// Points, not bars: a bar starts at 0, which a log axis cannot show.
	for i, tool := range peers {
		var pts plotter.XYs
		for j, r := range rows {
			res, ext := r.Results[tool], r.Results["ext4"]
			if res.ok() && ext.Median > 0 && res.Median > 0 {
				pts = append(pts, plotter.XY{X: float64(j) + 0.12*float64(i-len(peers)/2), Y: res.Median / ext.Median})
			}
		}
		if len(pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return "", err
		}
		sc.Color = toolColor(tool)
		sc.GlyphStyle.Radius = vg.Points(3.5)
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		p.Add(sc)
		p.Legend.Add(tool, sc)
	}
	one, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(rows)) - 0.5, Y: 1}})
	if err != nil {
		return "", err
	}
	one.Color = color.Black
	one.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
	p.Add(one)
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = -1
	return "", p.Save(30*vg.Centimeter, 14*vg.Centimeter, path)
}

// shortName trims a row name for an axis label.
func shortName(s string) string {
	s = strings.TrimPrefix(s, "package install (go mod download, local cache)")
	if s == "" {
		return "package install"
	}
	if i := strings.Index(s, " ("); i > 0 {
		s = s[:i]
	}
	return strings.TrimSuffix(s, " && git commit")
}

func plotCDF(r *row, path string) (string, error) {
	if r == nil {
		return "not drawn: the agent section did not run", nil
	}
	p := newPlot("lstat latency CDF", "latency (µs, log)", "fraction of lstat calls")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	drawn := 0
	for _, tool := range []string{"tine", "tine, /dev/fuse", "ext4", "btrfs", "overlayfs", "fuse-overlayfs"} {
		res := r.Results[tool]
		if !res.ok() || len(res.Quantiles) < 2 {
			continue
		}
		pts := make(plotter.XYs, len(res.Quantiles))
		for i, q := range res.Quantiles {
			pts[i] = plotter.XY{X: math.Max(q*1e6, 0.01), Y: float64(i) / float64(len(res.Quantiles)-1)}
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return "", err
		}
		l.Color = toolColor(tool)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(tool, l)
		drawn++
	}
	if drawn == 0 {
		return "not drawn: no per-call latencies in the results", nil
	}
	p.Legend.Top, p.Legend.Left = false, false // bottom right, where the curves are not
	return "", p.Save(16*vg.Centimeter, 11*vg.Centimeter, path)
}

// filesOf parses "1k", "10k", "100k" after prefix in a row name.
func filesOf(name, prefix string) (float64, bool) {
	rest := strings.TrimPrefix(name, prefix)
	f := strings.Fields(rest)
	if len(f) == 0 {
		return 0, false
	}
	n := strings.TrimSuffix(f[0], "k")
	v, err := strconv.ParseFloat(n, 64)
	if err != nil {
		return 0, false
	}
	if strings.HasSuffix(f[0], "k") {
		v *= 1000
	}
	return v, true
}

func plotVsSize(s *section, prefix, path, what string) (string, error) {
	if s == nil {
		return "not drawn: the snapshot and fork section did not run", nil
	}
	p := newPlot(what+" latency against files in the tree", "files (log)", "median latency (ms, log)")
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	drawn := 0
	for _, tool := range []string{"tine", "tine pool", "btrfs", "overlayfs", "git", "cp -a"} {
		var pts plotter.XYs
		for _, r := range s.Rows {
			if !strings.HasPrefix(r.Name, prefix) {
				continue
			}
			n, ok := filesOf(r.Name, prefix)
			if res := r.Results[tool]; ok && res.ok() {
				pts = append(pts, plotter.XY{X: n, Y: res.Median * 1e3})
			}
		}
		ok, err := addSeries(p, tool, pts, toolColor(tool))
		if err != nil {
			return "", err
		}
		if ok {
			drawn++
		}
	}
	if drawn == 0 {
		return "not drawn: no " + what + " rows in the results", nil
	}
	return "", p.Save(16*vg.Centimeter, 11*vg.Centimeter, path)
}

func plotDiff(s *section, path string) (string, error) {
	if s == nil {
		return "not drawn: the diff section did not run", nil
	}
	p := newPlot(s.Title, "changed files (log)", "median latency (ms, log)")
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	drawn := 0
	for _, tool := range []string{"tine", "btrfs", "git"} {
		var pts plotter.XYs
		for _, r := range s.Rows {
			f := strings.Fields(strings.TrimPrefix(r.Name, "diff, "))
			if len(f) == 0 {
				continue
			}
			n, ok := filesOf(f[0], "")
			if res := r.Results[tool]; ok && res.ok() {
				pts = append(pts, plotter.XY{X: n, Y: res.Median * 1e3})
			}
		}
		ok, err := addSeries(p, tool, pts, toolColor(tool))
		if err != nil {
			return "", err
		}
		if ok {
			drawn++
		}
	}
	if drawn == 0 {
		return "not drawn: no diff rows in the results", nil
	}
	return "", p.Save(16*vg.Centimeter, 11*vg.Centimeter, path)
}

// addSeries adds pts to p as a line with points in colour c, named in
// the legend; it reports whether there was a point to draw.
func addSeries(p *plot.Plot, name string, pts plotter.XYs, c color.Color) (bool, error) {
	if len(pts) == 0 {
		return false, nil
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return false, err
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return false, err
	}
	l.Color, sc.Color = c, c
	p.Add(l, sc)
	p.Legend.Add(name, l, sc)
	return true, nil
}
