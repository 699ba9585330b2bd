package api

import (
	"testing"
	"time"

	"tine/sandbox"
)

// FuzzInsideResources: whatever a sandbox sends to POST
// /v1/self/resources and POST /v1/self/approvals, and whatever wait it
// gives GET /v1/self/approvals/{id}, decoding and checking never panic;
// a request the policy does not refuse never takes a limit past the
// ceiling, never lowers one, and is granted at once only within the
// grant; and the bounds on questions and waits hold.
func FuzzInsideResources(f *testing.F) {
	for _, s := range []struct {
		body, wait string
		cur        int64
	}{
		{`{"limits":{"memory_bytes":1073741824,"cpus":1,"pids":512}}`, "30s", 0},
		{`{"limits":{"memory_bytes":4294967297}}`, "10m1s", 1 << 30},
		{`{"limits":{"cpus":2.5,"project_bytes":1}}`, "-1s", 100},
		{`{"limits":{"cpus":1e308}}`, "1e3h", 7},
		{`{"limits":{"pids":9223372036854775807}}`, "9223372036854775807ns", 1},
		{`{"limits":{"gpu":true,"pids":1}}`, "", 0},
		{`{"limits":{"cpus":-0.5}}`, "0", 0},
		{`{"reason":"deploy?","timeout_s":86401}`, "1ms", 0},
		{`{"reason":"deploy?","timeout_s":-1,"wait":true}`, "5m", 0},
	} {
		f.Add(s.body, s.wait, s.cur)
	}
	grant := sandbox.Limits{Pids: 512, LimitsExt: sandbox.LimitsExt{MemoryBytes: 1 << 30, CPUs: 1}}
	max := sandbox.Limits{Pids: 4096, ProjectBytes: 20 << 30, LimitsExt: sandbox.LimitsExt{MemoryBytes: 4 << 30, CPUs: 2}}
	f.Fuzz(func(t *testing.T, body, wait string, cur int64) {
		b := []byte(body)
		have := sandbox.Limits{Pids: cur, ProjectBytes: cur, LimitsExt: sandbox.LimitsExt{MemoryBytes: cur, CPUs: float64(cur % 8)}}
		if cur < 0 {
			have = sandbox.Limits{}
		}
		var rr ResourcesRequest
		if decodeJSON(b, &rr) == nil && rr.validate() == nil {
			d := decideRaise(have, rr.Limits, grant, max)
			nl, hl, gl, ml := levels(&d.next), levels(&have), levels(&grant), levels(&max)
			for i := range nl {
				if nl[i].less(hl[i]) || (hl[i].zero() && !nl[i].zero()) {
					t.Fatalf("%s lowered or limited: %s from %s", nl[i].field, nl[i], hl[i])
				}
				raised := hl[i].less(nl[i])
				if d.refused == "" && raised && ml[i].less(nl[i]) {
					t.Fatalf("%s raised to %s past the ceiling %s", nl[i].field, nl[i], ml[i])
				}
				if d.refused == "" && raised && !d.pend && gl[i].less(nl[i]) {
					t.Fatalf("%s granted %s at once, past the grant %s", nl[i].field, nl[i], gl[i])
				}
			}
			// Applying the same request again changes nothing more.
			if d.refused == "" {
				if again := decideRaise(d.next, rr.Limits, grant, max); len(again.raised) != 0 {
					t.Fatalf("raised twice: %v", again.raised)
				}
			}
		}
		var ar ApprovalRequest
		if decodeJSON(b, &ar) == nil && ar.validate() == nil {
			if ar.TimeoutS < 0 || ar.TimeoutS > maxQuestionTimeout || ar.Reason == "" || len(ar.Reason) > maxReason {
				t.Fatalf("question passed: %+v", ar)
			}
		}
		if d, err := parseWait(wait); err == nil && (d < 0 || d > maxLongPoll) {
			t.Fatalf("wait %q passed as %s", wait, d)
		} else if err == nil && wait != "" {
			if _, perr := time.ParseDuration(wait); perr != nil {
				t.Fatalf("wait %q passed, not a duration", wait)
			}
		}
	})
}
