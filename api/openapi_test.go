package api

import (
	"encoding/json"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"tine/audit"
	"tine/cowfs"
	"tine/execpolicy"
	"tine/guestagent/proto"
	"tine/merge"
	"tine/netpolicy"
	"tine/oci"
	"tine/sandbox"
)

// openAPI is the part of docs/api/openapi.json the checks read.
type openAPI struct {
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			GoType     string                     `json:"x-go-type"`
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"schemas"`
	} `json:"components"`
}

func readOpenAPI(t *testing.T) *openAPI {
	b, err := os.ReadFile("../docs/api/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docs/api/openapi.json: %v", err)
	}
	return &doc
}

// TestOpenAPIRoutes: every route the server answers is documented, and
// every documented operation is a route.
func TestOpenAPIRoutes(t *testing.T) {
	doc := readOpenAPI(t)
	documented := map[string]bool{}
	for path, item := range doc.Paths {
		for method := range item {
			if method == "parameters" {
				continue
			}
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	s := NewServer(nil, ServerOptions{})
	served := map[string]bool{}
	for _, r := range s.routes {
		// {ref...} (the rest of the path) is {ref} in OpenAPI.
		p := strings.ReplaceAll(r.path, "...}", "}")
		served[r.method+" "+p] = true
		if !documented[r.method+" "+p] {
			t.Errorf("route %s %s is not in docs/api/openapi.json", r.method, p)
		}
	}
	for op := range documented {
		if !served[op] {
			t.Errorf("docs/api/openapi.json documents %s, which the server does not answer", op)
		}
	}
}

// goTypes are the Go types the document's schemas name in x-go-type.
var goTypes = map[string]any{
	"api.Error": Error{}, "api.CreateRequest": CreateRequest{}, "api.Sandbox": Sandbox{},
	"api.ForkRequest": ForkRequest{}, "api.SnapshotRequest": SnapshotRequest{},
	"api.RollbackRequest": RollbackRequest{}, "api.Change": Change{}, "api.ArchivePut": ArchivePut{},
	"api.PromoteRequest": PromoteRequest{}, "api.PromoteResponse": PromoteResponse{},
	"api.ExecRequest": ExecRequest{}, "api.ExecEvent": ExecEvent{}, "api.ExecInput": ExecInput{},
	"api.Info": Info{}, "api.RuntimeInfo": RuntimeInfo{}, "api.FSRequest": FSRequest{},
	"api.FSResponse": FSResponse{}, "api.Approval": Approval{}, "api.AnswerRequest": AnswerRequest{},
	"sandbox.Limits": sandbox.Limits{}, "sandbox.GuestSize": sandbox.GuestSize{}, "sandbox.Staleness": sandbox.Staleness{},
	"sandbox.SnapshotInfo": sandbox.SnapshotInfo{}, "sandbox.MergeConflict": sandbox.MergeConflict{}, "merge.Conflict": merge.Conflict{},
	"cowfs.Conflict": cowfs.Conflict{}, "cowfs.Refusal": cowfs.Refusal{},
	"proto.Started": proto.Started{}, "proto.Exit": proto.Exit{}, "proto.Resize": proto.Resize{},
	"proto.Signal": proto.Signal{}, "proto.Process": proto.Process{}, "proto.Port": proto.Port{},
	"proto.Event":      proto.Event{},
	"netpolicy.Policy": netpolicy.Policy{}, "sandbox.NetworkStatus": sandbox.NetworkStatus{},
	"api.NetworkRequest": NetworkRequest{}, "api.ExposeRequest": ExposeRequest{}, "api.Exposures": Exposures{},
	"api.AutoExposeRequest": AutoExposeRequest{}, "api.SecretRequest": SecretRequest{},
	"sandbox.Exposure": sandbox.Exposure{}, "sandbox.SecretInfo": sandbox.SecretInfo{}, "sandbox.SecretBinding": sandbox.SecretBinding{},
	"api.LimitsResponse": LimitsResponse{}, "api.UsageResponse": UsageResponse{}, "api.SandboxUsage": SandboxUsage{}, "sandbox.Usage": sandbox.Usage{}, "audit.Record": audit.Record{},
	"audit.Head": audit.Head{}, "audit.Report": audit.Report{}, "api.VerifyResponse": VerifyResponse{},
	"execpolicy.Rule": execpolicy.Rule{}, "execpolicy.Policy": execpolicy.Policy{},
	"api.MessageRequest": MessageRequest{}, "api.Message": Message{}, "api.MessageSent": MessageSent{},
	"sandbox.Image": sandbox.Image{}, "oci.Config": oci.Config{}, "oci.Stats": oci.Stats{}, "api.Image": Image{},
	"api.PullRequest": PullRequest{}, "api.ImportRequest": ImportRequest{}, "api.RemoveImageResponse": RemoveImageResponse{},
}

// jsonFields returns the JSON names of a struct's fields as encoding/json
// sees them: embedded structs without a tag are flattened.
func jsonFields(t reflect.Type, into map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" {
			continue
		}
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			jsonFields(f.Type, into)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		into[tag] = true
	}
}

// marshaledFields adds the top-level JSON names of v as its own
// MarshalJSON writes them, for a value whose string fields all hold a byte
// that is not UTF-8 (so that fields written only for such paths, like
// path_b64, show).
func marshaledFields(t *testing.T, v any, into map[string]bool) {
	if _, ok := v.(json.Marshaler); !ok {
		return
	}
	p := reflect.New(reflect.TypeOf(v))
	for i := 0; i < p.Elem().NumField(); i++ {
		if f := p.Elem().Field(i); f.Kind() == reflect.String && f.CanSet() {
			f.SetString("\xff")
		}
	}
	b, err := json.Marshal(p.Interface())
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%T marshals to %s, not an object: %v", v, b, err)
	}
	for k := range m {
		into[k] = true
	}
}

// TestOpenAPISchemas: each schema that names a Go type has exactly that
// type's JSON fields, and every request and response type is documented.
func TestOpenAPISchemas(t *testing.T) {
	doc := readOpenAPI(t)
	seen := map[string]bool{}
	for name, s := range doc.Components.Schemas {
		if s.GoType == "" {
			continue
		}
		seen[s.GoType] = true
		v, ok := goTypes[s.GoType]
		if !ok {
			t.Errorf("schema %s names Go type %s, which this test does not know; add it to goTypes", name, s.GoType)
			continue
		}
		want := map[string]bool{}
		jsonFields(reflect.TypeOf(v), want)
		marshaledFields(t, v, want)
		var missing, extra []string
		for f := range want {
			if _, ok := s.Properties[f]; !ok {
				missing = append(missing, f)
			}
		}
		for f := range s.Properties {
			if !want[f] {
				extra = append(extra, f)
			}
		}
		sort.Strings(missing)
		sort.Strings(extra)
		if len(missing)+len(extra) > 0 {
			t.Errorf("schema %s (%s): fields missing from the document %v, documented but not in Go %v", name, s.GoType, missing, extra)
		}
	}
	for g := range goTypes {
		if !seen[g] {
			t.Errorf("Go type %s has no schema in docs/api/openapi.json", g)
		}
	}
}
