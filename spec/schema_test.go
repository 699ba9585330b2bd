package spec

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestSchemaMatchesTypes: docs/tine.schema.json names exactly the fields
// the parser takes, at the top level and in each nested object.
func TestSchemaMatchesTypes(t *testing.T) {
	b, err := os.ReadFile("../docs/tine.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	type obj struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	var root obj
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	props := func(o obj) []string {
		var out []string
		for k := range o.Properties {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	fields := func(v any) []string {
		var out []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			tag, _, _ := strings.Cut(rt.Field(i).Tag.Get("yaml"), ",")
			if tag != "-" && tag != "" {
				out = append(out, tag)
			}
		}
		slices.Sort(out)
		return out
	}
	if got, want := props(root), fields(Spec{}); !slices.Equal(got, want) {
		t.Errorf("schema top level %v, parser %v", got, want)
	}
	for name, v := range map[string]any{"base": Base{}, "limits": Limits{}, "network": Network{}, "exec": ExecPolicy{}} {
		var o obj
		json.Unmarshal(root.Properties[name], &o)
		if got, want := props(o), fields(v); !slices.Equal(got, want) {
			t.Errorf("schema %s %v, parser %v", name, got, want)
		}
	}
	var secrets struct{ Items obj }
	json.Unmarshal(root.Properties["secrets"], &secrets)
	if got, want := props(secrets.Items), fields(Secret{}); !slices.Equal(got, want) {
		t.Errorf("schema secrets %v, parser %v", got, want)
	}
}
