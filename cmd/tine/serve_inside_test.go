package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"tine/api"
	"tine/api/client"
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

// TestServeInsidePolicyEndToEnd: a daemon started with --inside-grant and
// --inside-max grants a raise asked from inside at once, holds one past
// the grant for tine approve, which applies it to the running sandbox,
// and refuses one past the max.
func TestServeInsidePolicyEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("sandboxes need /dev/fuse")
	}
	base := t.TempDir()
	c := cli{t: t, root: filepath.Join(base, "root")}
	c.ok("init")
	var log bytes.Buffer
	d := exec.Command(tineBin, "--root", c.root, "serve", "--warm", "0", "--inside-grant", "pids=512", "--inside-max", "pids=4096,memory=1G")
	d.Stdout, d.Stderr = &log, &log
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Process.Signal(syscall.SIGTERM)
		d.Wait()
	})
	cl := client.New(filepath.Join(c.root, api.SocketName))
	for deadline := time.Now().Add(20 * time.Second); cl.Ping(context.Background()) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not answer: %s", log.String())
		}
	}
	proj := filepath.Join(base, "proj")
	os.MkdirAll(proj, 0o755)
	// create's own --pids and --disk are kept (they were dropped, and
	// --disk refused, when the shared limit flags read them again).
	c.ok("create", "--from", proj, "--name", "in", "--pids", "100", "--disk", "64M", "--memory", "256M")
	var lim api.LimitsResponse
	if err := json.Unmarshal([]byte(c.ok("limits", "in", "--json")), &lim); err != nil || lim.Limits.Pids != 100 || lim.Limits.ProjectBytes != 64<<20 || lim.Limits.MemoryBytes != 256<<20 {
		t.Fatalf("limits at create: %+v, %v", lim.Limits, err)
	}
	ask := func(body string) string {
		return c.ok("exec", "in", "--", "curl", "-sS", "-w", " %{http_code}", "--unix-socket", api.InsideSocket, "-d", body, "http://tine/v1/self/resources")
	}
	pids := func() int64 {
		var lim api.LimitsResponse
		if err := json.Unmarshal([]byte(c.ok("limits", "in", "--json")), &lim); err != nil {
			t.Fatal(err)
		}
		return lim.Limits.Pids
	}
	if out := ask(`{"limits":{"pids":512}}`); !strings.HasSuffix(out, " 200") || pids() != 512 {
		t.Fatalf("within the grant: %s, pids %d", out, pids())
	}
	out := ask(`{"limits":{"pids":2048}}`)
	id := regexp.MustCompile(`ap-[0-9a-f]{16}`).FindString(out)
	if !strings.HasSuffix(out, " 202") || id == "" || pids() != 512 {
		t.Fatalf("past the grant: %s, pids %d", out, pids())
	}
	if l := c.ok("approvals"); !strings.Contains(l, id) || !strings.Contains(l, "pids=2048") {
		t.Fatalf("tine approvals:\n%s", l)
	}
	c.ok("approve", id)
	if n := pids(); n != 2048 {
		t.Fatalf("pids after tine approve: %d", n)
	}
	if out := ask(`{"limits":{"memory_bytes":2147483648}}`); !strings.HasSuffix(out, " 403") || !strings.Contains(out, "memory_bytes 2147483648: above the policy's ceiling of 1073741824") {
		t.Fatalf("past the max: %s", out)
	}
	if a := c.ok("audit", "in"); !strings.Contains(a, "resources-granted") || !strings.Contains(a, "resources-refused") {
		t.Fatalf("audit:\n%s", a)
	}
}
