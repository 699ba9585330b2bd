package main

import (
	"time"

	"tine/bench/internal/sandboxrun"
)

// saveJSON writes the run to path for bench/report.
func (r *report) saveJSON(path string) error {
	out := sandboxrun.Run{Command: r.command, Started: r.date, Seconds: time.Since(r.date).Seconds(), Host: r.host,
		LoadStart: r.loadStart, LoadEnd: r.loadEnd, Goals: r.goals}
	for _, x := range r.rows {
		sr := sandboxrun.Row{Section: x.section, Tool: x.tool, What: x.what, Note: x.note}
		for _, d := range x.samples {
			sr.Samples = append(sr.Samples, d.Seconds())
		}
		out.Rows = append(out.Rows, sr)
	}
	return out.Save(path)
}
