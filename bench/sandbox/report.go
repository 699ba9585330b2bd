package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// row is one measured line: samples of one tool doing one thing.
type row struct {
	section, tool, what string
	samples             []time.Duration
	note                string
}

func (r row) pct(p float64) time.Duration {
	if len(r.samples) == 0 {
		return 0
	}
	s := slices.Clone(r.samples)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// report is a run's rows, notes and skipped peers.
type report struct {
	date    time.Time
	command string
	host    string
	// loadStart and loadEnd are /proc/loadavg's first three fields before
	// and after the run.
	loadStart, loadEnd string
	rows               []row
	notes              []string
	skipped            []string
	goals              []string
}

func (r *report) add(section, tool, what string, s []time.Duration, note string) {
	r.rows = append(r.rows, row{section, tool, what, s, note})
}

func (r *report) find(section, tool string) *row {
	for i := range r.rows {
		if r.rows[i].section == section && r.rows[i].tool == tool {
			return &r.rows[i]
		}
	}
	return nil
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 2, 64)
}

// table renders the rows: per section, each tool's p50 and p90 and the
// ratio of the section's first (tine) row's p50 to it (none in the
// breakdown, whose rows are steps, not peers).
func (r *report) table(md bool) string {
	var b strings.Builder
	sep := "  "
	if md {
		b.WriteString("| section | tool | what | n | p50 ms | p90 ms | tine/peer (p50) |\n|---|---|---|---|---|---|---|\n")
	}
	var first map[string]time.Duration = map[string]time.Duration{}
	for _, x := range r.rows {
		p50 := x.pct(0.5)
		ratio := ""
		f, ok := first[x.section]
		switch {
		case x.section == "breakdown":
		case ok && p50 > 0:
			ratio = fmt.Sprintf("%.3gx", float64(f)/float64(p50))
		case !ok:
			first[x.section] = p50
		}
		what := x.what
		if x.note != "" {
			what += " (" + x.note + ")"
		}
		if md {
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s | %s |\n", x.section, x.tool, what, len(x.samples), ms(p50), ms(x.pct(0.9)), ratio)
		} else {
			fmt.Fprintf(&b, "%-14s%s%-22s%s%-58s%s%4d%s%9s%s%9s%s%8s\n", x.section, sep, x.tool, sep, what, sep, len(x.samples), sep, ms(p50), sep, ms(x.pct(0.9)), sep, ratio)
		}
	}
	return b.String()
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "bench/sandbox %s on %s\n\n", r.date.Format(time.RFC3339), r.host)
	fmt.Fprintf(w, "%-14s  %-22s  %-58s  %4s  %9s  %9s  %8s\n", "section", "tool", "what", "n", "p50 ms", "p90 ms", "tine/x")
	io.WriteString(w, r.table(false))
	for _, n := range r.notes {
		fmt.Fprintln(w, "note:", n)
	}
	for _, s := range r.skipped {
		fmt.Fprintln(w, "skipped:", s)
	}
	for _, g := range r.goals {
		fmt.Fprintln(w, "goal:", g)
	}
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run of %s on %s (`go run ./bench/sandbox`).\n\n", r.date.Format("2006-01-02 15:04 MST"), r.host)
	b.WriteString(r.table(true))
	b.WriteString("\n")
	for _, g := range r.goals {
		fmt.Fprintf(&b, "- Goal: %s\n", g)
	}
	for _, n := range r.notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	for _, s := range r.skipped {
		fmt.Fprintf(&b, "- Skipped: %s\n", s)
	}
	return b.String()
}

// goals states each goal of the issue as met or not, with the numbers.
func (b *bench) goals(rep *report) {
	sec := "create+first"
	if t, bw := rep.find(sec, "tine (warm)"), rep.find(sec, "bwrap"); t != nil {
		g := fmt.Sprintf("create → first command ≤ 5 ms p50: %s ms", ms(t.pct(0.5)))
		if bw != nil {
			g += fmt.Sprintf(" (bwrap %s ms, ratio %.2fx)", ms(bw.pct(0.5)), float64(t.pct(0.5))/float64(bw.pct(0.5)))
		}
		rep.goals = append(rep.goals, g+metOr(t.pct(0.5) <= 5*time.Millisecond))
	}
	if t := rep.find("fork x10", "tine"); t != nil {
		rep.goals = append(rep.goals, fmt.Sprintf("10 forks all answered ≤ 30 ms: %s ms p50", ms(t.pct(0.5)))+metOr(t.pct(0.5) <= 30*time.Millisecond))
	}
}

func metOr(ok bool) string {
	if ok {
		return ": met"
	}
	return ": not met"
}
