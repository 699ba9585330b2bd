package api

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"tine/sandbox"
)

// FuzzMessageRequest: whatever a sandbox sends as a message request (a
// JSON body, a query), decoding never panics, a request naming a sender
// never passes, a target that passes is a plain sandbox name, and a body
// that passes is one JSON value the inbox can store as it is, or is
// refused by its size.
func FuzzMessageRequest(f *testing.F) {
	for _, s := range [][2]string{
		{`{"to":"b","body":"hi"}`, "wait=30s&take=true&after=3"},
		{`{"to":"b","body":{"a":[1,2,3]}}`, "wait=5"},
		{`{"to":"b","from":"a","body":1}`, "take=yes"},
		{`{"to":"b","FROM":"host","body":1}`, "wait=-1s"},
		{`{"to":"b","Sender":"host","body":1}`, "after=-1"},
		{`{"to":"../b","body":1}`, "wait=1h"},
		{`{"to":"b/../c","body":null}`, "after=18446744073709551616"},
		{`{"to":"b","body":1}{"to":"c"}`, "wait=%00"},
		{`{"to":"b\u0000","body":"x"}`, ""},
		{`{"to":"b"}`, "wait=9999999999999"},
		{`{"To":"b","Body":"` + strings.Repeat("x", 70000) + `"}`, ""},
		{`[]`, ""}, {``, ""}, {`{"to":"b","body":"\ud800"}`, ""},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, body, query string) {
		req, err := decodeMessageRequest([]byte(body))
		if err == nil {
			var probe map[string]json.RawMessage
			json.Unmarshal([]byte(body), &probe)
			for k := range probe {
				if strings.EqualFold(k, "from") || strings.EqualFold(k, "sender") {
					t.Fatalf("a request naming a sender (%q) passed: %s", k, body)
				}
			}
			if req.To != "" && (!validName(req.To) || strings.ContainsAny(req.To, "/\x00")) {
				t.Fatalf("target %q passed", req.To)
			}
			if len(req.Body) == 0 {
				t.Fatal("an empty body passed")
			}
			var b bytes.Buffer
			if json.Compact(&b, req.Body) == nil && b.Len() <= sandbox.MaxMessageBytes && b.String() != "null" {
				if !json.Valid(b.Bytes()) {
					t.Fatalf("body %q is not JSON", b.Bytes())
				}
			}
		}
		r := httptest.NewRequest("GET", "/v1/messages", nil)
		r.URL.RawQuery = query
		o, err := readOptions(r)
		if err == nil && (o.Wait < 0 || o.Wait > sandbox.MaxMessageWait) {
			t.Fatalf("wait %v passed from %q", o.Wait, query)
		}
	})
}
