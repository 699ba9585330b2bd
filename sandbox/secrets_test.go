package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"tine/sandbox"
)

// recorder is an Auditor that keeps its records.
type recorder struct {
	mu   sync.Mutex
	recs []string
}

func (r *recorder) Append(kind string, f map[string]any) error {
	b, _ := json.Marshal(map[string]any{"kind": kind, "fields": f})
	r.mu.Lock()
	r.recs = append(r.recs, string(b))
	r.mu.Unlock()
	return nil
}

func (r *recorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.recs, "\n")
}

// TestSecretNeverEntersSandbox stores a secret in the daemon and binds it
// to one destination: the sandbox sees a placeholder; an HTTPS request
// that sends the placeholder reaches the upstream with the value; plain
// HTTP to the same name and HTTPS to another allowed name do not get it.
// Then the value is searched for, and must not be found: in every file of
// the sandbox's root as the sandbox sees it, in the environment and
// command line of each of its processes, in its service's log, and
// anywhere in the state root but the secret's own file. Each credentialed
// request is audited with the secret's name and destination, never the
// value.
func TestSecretNeverEntersSandbox(t *testing.T) {
	var rb [12]byte
	rand.Read(rb[:])
	value := "s3cret-" + hex.EncodeToString(rb[:])
	var mu sync.Mutex
	got := map[string]string{} // "scheme host" -> Authorization as received
	up, upCA := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		a := r.Header.Get("Authorization")
		mu.Lock()
		got[scheme+" "+r.Host] = a
		mu.Unlock()
		if a == "Bearer "+value {
			fmt.Fprintln(w, "authorized")
			return
		}
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintln(w, "unauthorized")
	}))
	audit := &recorder{}
	e := newEnvWith(t, sandbox.Options{Network: sandbox.NetworkOptions{Dial: up.dial, RootCAs: upCA.Pool(), Audit: audit}})
	ctx := context.Background()

	if err := e.m.SetSecret("API_TOKEN", []byte(value)); err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(e.root, "secrets", "API_TOKEN")
	if st, err := os.Stat(secretFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("secret file: %v %v", st, err)
	}
	if st, _ := os.Stat(filepath.Dir(secretFile)); st.Mode().Perm() != 0o700 {
		t.Errorf("secrets directory mode %v", st.Mode().Perm())
	}
	if err := e.m.SetSecret("BAD", []byte("line\nbreak")); err == nil {
		t.Error("a value with a newline was stored")
	}
	b, err := sandbox.ParseSecretBinding("API_TOKEN=api.test:header:Authorization:Bearer")
	if err != nil {
		t.Fatal(err)
	}
	// The destination must be allowed; the secret must exist.
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "nope", Dir: e.project, Network: allowPolicy(t, "other.test"),
		Secrets: []sandbox.SecretBinding{b}}); !errors.Is(err, sandbox.ErrBinding) {
		t.Errorf("binding to a destination the policy does not allow: %v", err)
	}
	missing := b
	missing.Name = "MISSING"
	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "nope", Dir: e.project, Network: allowPolicy(t, "api.test"),
		Secrets: []sandbox.SecretBinding{missing}}); !errors.Is(err, sandbox.ErrNoSecret) {
		t.Errorf("binding a secret that is not set: %v", err)
	}

	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Name: "cred", Dir: e.project,
		Network:  allowPolicy(t, "api.test", "other.test"),
		Secrets:  []sandbox.SecretBinding{b},
		Services: []string{`echo "service sees token=$API_TOKEN"; env; exec sleep 3600`}}); err != nil {
		t.Fatal(err)
	}
	if out := e.mustSh("cred", `echo "$API_TOKEN"`); out != sandbox.PlaceholderPrefix+"API_TOKEN\n" {
		t.Errorf("the sandbox's variable: %q", out)
	}
	out := e.mustSh("cred", `curl -sS --max-time 10 -H "Authorization: Bearer $API_TOKEN" https://api.test/ -o /tmp/answer && cat /tmp/answer`)
	if out != "authorized\n" {
		t.Fatalf("credentialed request: %q (upstream got %v)", out, got)
	}
	e.sh("cred", `curl -sS --max-time 10 -H "Authorization: Bearer $API_TOKEN" http://api.test/; curl -sS --max-time 10 -H "Authorization: Bearer $API_TOKEN" https://other.test/`)
	mu.Lock()
	for k, v := range got {
		if k != "https api.test" && strings.Contains(v, value) {
			t.Errorf("%s got the secret", k)
		}
	}
	mu.Unlock()

	// Audit: name and destination, never the value.
	recs := audit.all()
	if !strings.Contains(recs, `"secret":"API_TOKEN"`) || !strings.Contains(recs, `"destination":"api.test"`) {
		t.Errorf("no audit record of the credentialed request:\n%s", recs)
	}
	if strings.Contains(recs, value) {
		t.Error("an audit record holds the value")
	}

	// The sandbox's processes: find one on the host, then all in its pid
	// namespace.
	e.mustSh("cred", "exec sleep 600 </dev/null >/dev/null 2>&1 & echo started")
	var probe int
	for _, p := range procs() {
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); string(cmd) == "sleep\x00600\x00" {
			probe = p
		}
	}
	if probe == 0 {
		t.Fatal("no process of the sandbox found on the host")
	}
	pidNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", probe))
	n := 0
	for _, p := range procs() {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p)); l != pidNS {
			continue
		}
		n++
		for _, f := range []string{"environ", "cmdline"} {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/%s", p, f)); bytes.Contains(b, []byte(value)) {
				t.Errorf("process %d's %s holds the secret", p, f)
			}
		}
	}
	if n < 3 {
		t.Errorf("found %d processes of the sandbox, want its init, agent, service and more", n)
	}

	// Every file the sandbox can have written, read as the sandbox sees
	// it: its root is an overlay on the host's root, so each path of its
	// own layer (the upper directory) and every other mount in it (the
	// project, /tmp, /run, /dev/shm...), but not the host's files below
	// nor /proc and /sys (its processes are searched above).
	view := fmt.Sprintf("/proc/%d/root", probe)
	files, size := 0, int64(0)
	check := func(rel string) {
		st, err := os.Lstat(view + rel)
		if err != nil || !st.Mode().IsRegular() {
			return
		}
		files++
		hit, n := fileContains(view+rel, value)
		size += n
		if hit {
			t.Errorf("the sandbox's file %s holds the secret", rel)
		}
	}
	upper := filepath.Join(e.root, "sandboxes", "cred", "runtime", "upper")
	filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			check(strings.TrimPrefix(p, upper))
		}
		return nil
	})
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", probe))
	if err != nil {
		t.Fatal(err)
	}
	mounts := 0
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		_, after, ok := strings.Cut(line, " - ")
		if len(f) < 5 || !ok {
			continue
		}
		mp, fstype := f[4], strings.Fields(after)[0]
		if mp == "/" || strings.HasPrefix(mp, "/proc") || strings.HasPrefix(mp, "/sys") ||
			fstype == "proc" || fstype == "sysfs" || strings.HasPrefix(fstype, "cgroup") {
			continue
		}
		mounts++
		filepath.WalkDir(view+mp, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				check(strings.TrimPrefix(p, view))
			}
			return nil
		})
	}
	t.Logf("searched %d files (%d KiB) of the sandbox's layer and %d other mounts", files, size>>10, mounts)
	if files < 3 || mounts < 3 {
		t.Errorf("searched only %d files in %d mounts", files, mounts)
	}
	if hit, _ := fileContains(view+"/tmp/answer", "authorized"); !hit {
		t.Error("the search does not see the sandbox's own files (/tmp/answer)")
	}

	// The service's log, and the whole state root but the secret's file.
	var log bytes.Buffer
	rc, err := e.m.Logs(ctx, "cred", sandbox.LogOptions{})
	if err == nil {
		log.ReadFrom(rc)
		rc.Close()
	}
	if !strings.Contains(log.String(), "service sees token="+sandbox.PlaceholderPrefix) {
		t.Errorf("the service's log lacks its placeholder line: %.300q", log.String())
	}
	if strings.Contains(log.String(), value) {
		t.Error("the service's log holds the secret")
	}
	// The test's whole directory: state root, cowfs store, project.
	filepath.WalkDir(filepath.Dir(e.root), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || p == secretFile {
			return nil
		}
		if hit, _ := fileContains(p, value); hit {
			t.Errorf("host file %s holds the secret", p)
		}
		return nil
	})
}

// procs lists the host's process ids.
func procs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		var p int
		if _, err := fmt.Sscanf(e.Name(), "%d", &p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// fileContains says whether the file at p holds s, reading it in pieces;
// it also returns the bytes read.
func fileContains(p, s string) (bool, int64) {
	f, err := os.Open(p)
	if err != nil {
		return false, 0
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	keep := len(s) - 1
	var total int64
	carry := 0
	for {
		n, err := f.Read(buf[carry:])
		total += int64(n)
		if bytes.Contains(buf[:carry+n], []byte(s)) {
			return true, total
		}
		if err != nil {
			return false, total
		}
		if carry+n > keep {
			copy(buf, buf[carry+n-keep:carry+n])
			carry = keep
		} else {
			carry += n
		}
	}
}
