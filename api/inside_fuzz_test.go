package api

import (
	"strings"
	"testing"

	"tine/sandbox"
)

// FuzzInsideRequest: whatever code in a sandbox sends to its own API (a
// path's sandbox name and a JSON body), decoding and checking never panic,
// a name outside the asking sandbox's tree never resolves, and a raise
// past the policy is never let through.
func FuzzInsideRequest(f *testing.F) {
	for _, s := range [][2]string{
		{"self", `{"reason":"deploy?","wait":true}`},
		{"a-1", `{"limits":{"pids":400},"reason":"build"}`},
		{"..", `{"limits":{"pids":-1}}`}, {"../b", `{"limits":{"project_bytes":1e20}}`},
		{"a%2f..%2fb", `{"reason":"\u0000"}`}, {"", `{"limits":{}}`}, {"b", `[]`},
		{"a/../b", `{"limits":{"pids":9223372036854775807}}`}, {"self\x00", `{"wait":"yes"}`},
	} {
		f.Add(s[0], s[1])
	}
	tree := map[string]bool{"a": true, "a-1": true}
	inTree := func(root, name string) bool { return root == "a" && tree[name] }
	max := sandbox.Limits{Pids: 500}
	have := sandbox.Limits{Pids: 100}
	f.Fuzz(func(t *testing.T, name, body string) {
		got, err := insideTarget("a", name, inTree)
		if err == nil && !tree[got] {
			t.Fatalf("name %q resolved to %q, outside the tree", name, got)
		}
		b := []byte(body)
		var ar ApprovalRequest
		if decodeJSON(b, &ar) == nil && validReason(ar.Reason) == nil && len(ar.Reason) > maxReason {
			t.Fatalf("reason of %d bytes passed", len(ar.Reason))
		}
		var rr ResourcesRequest
		if decodeJSON(b, &rr) == nil && rr.validate() == nil {
			if rr.Limits.Pids < 0 || rr.Limits.ProjectBytes < 0 {
				t.Fatalf("negative limits passed: %+v", rr.Limits)
			}
			if decideRaise(have, rr.Limits, sandbox.Limits{}, max).refused == "" && (rr.Limits.Pids > max.Pids || rr.Limits.ProjectBytes > 0) {
				t.Fatalf("raise past the policy let through: %+v", rr.Limits)
			}
		}
		if strings.ContainsRune(got, '/') {
			t.Fatalf("resolved name %q has a slash", got)
		}
	})
}
