package main

import "tine/bench/internal/sandboxrun"

// addSandbox reads bench/sandbox's results into the report.
func (rep *report) addSandbox(path string) error {
	sr, err := sandboxrun.Load(path)
	if err != nil {
		return err
	}
	rep.Sandbox = sr
	rep.Runs = append(rep.Runs, run{Command: sr.Command, Started: sr.Started, Seconds: sr.Seconds, LoadStart: sr.LoadStart, LoadEnd: sr.LoadEnd})
	return nil
}
