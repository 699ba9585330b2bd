package main

import (
	"tine/bench/internal/sandboxrun"
	"tine/bench/internal/vmrun"
)

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

// addVM reads bench/vmm's results into the report.
func (rep *report) addVM(path string) error {
	vr, err := vmrun.Load(path)
	if err != nil {
		return err
	}
	rep.VM = vr
	rep.Runs = append(rep.Runs, run{Command: vr.Command, Started: vr.Started, Seconds: vr.Seconds, LoadStart: vr.LoadStart, LoadEnd: vr.LoadEnd})
	return nil
}
