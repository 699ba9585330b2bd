package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"tine/sandbox"
)

func TestParseInsideLimits(t *testing.T) {
	for in, want := range map[string]sandbox.Limits{
		"":                                 {},
		"pids=512":                         {Pids: 512},
		"memory=1G,cpus=1,pids=512":        {Pids: 512, LimitsExt: sandbox.LimitsExt{MemoryBytes: 1 << 30, CPUs: 1}},
		" memory = 4G , cpus=0.5,disk=20G": {ProjectBytes: 20 << 30, LimitsExt: sandbox.LimitsExt{MemoryBytes: 4 << 30, CPUs: 0.5}},
	} {
		got, err := parseInsideLimits("inside-max", in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseInsideLimits(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, words := range map[string][]string{
		"memory=4X":         {"--inside-max", "memory", `"4X"`},
		"cpus=two":          {"--inside-max", "cpus", `"two"`},
		"cpus=NaN":          {"cpus"},
		"cpus=5000":         {"cpus", "4096"},
		"pids=-1":           {"pids", `"-1"`},
		"pids=1.5":          {"pids"},
		"disk=1.5G":         {"disk", "1.5G"},
		"gpu=1":             {`"gpu"`, "memory, cpus, pids or disk"},
		"memory":            {`"memory"`, "FIELD=VALUE"},
		"=1G":               {"FIELD=VALUE"},
		"pids=1,pids=2":     {"pids", "twice"},
		"memory=1M":         {"memory_bytes", "8M"},
		"memory=1G,,pids=2": {"FIELD=VALUE"},
	} {
		_, err := parseInsideLimits("inside-max", in)
		if err == nil {
			t.Errorf("parseInsideLimits(%q): no error", in)
			continue
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("parseInsideLimits(%q): %v; does not say %s", in, err, w)
			}
		}
	}
}

func TestInsideFlagsGrantWithinMax(t *testing.T) {
	o, err := insideFlags{grant: "memory=1G,cpus=1,pids=512", max: "memory=4G,cpus=2,pids=4096,disk=20G"}.options()
	if err != nil || o.Grant.Pids != 512 || o.MaxLimits.ProjectBytes != 20<<30 {
		t.Fatalf("options: %+v, %v", o, err)
	}
	for _, f := range []insideFlags{
		{grant: "memory=8G", max: "memory=4G"},
		{grant: "pids=10"},
		{grant: "cpus=1", max: "memory=4G"},
	} {
		if _, err := f.options(); err == nil || !strings.Contains(err.Error(), "--inside-grant") || !strings.Contains(err.Error(), "ceiling") {
			t.Errorf("options %+v: %v, want the grant refused", f, err)
		}
	}
}

// TestServeInsideFlagsExit2: tine serve with a bad policy flag exits 2
// naming the flag and the field, before it starts anything.
func TestServeInsideFlagsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"--inside-max", "memory=4Q"},
		{"--inside-grant", "cpus=-1", "--inside-max", "cpus=2"},
		{"--inside-grant", "pids=9000", "--inside-max", "pids=4096"},
		{"--inside-max", "swap=1G"},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"serve", "--root", t.TempDir()}, args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), "--inside-") {
			t.Errorf("tine serve %v: exit %d, stderr %q; want 2 naming the flag", args, code, errOut.String())
		}
	}
}
