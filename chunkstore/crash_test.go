package chunkstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The crash test re-executes the test binary as a writer process (selected
// by these environment variables in TestMain) and kills it with SIGKILL.
const (
	envWriterDir  = "TINE_CHUNKSTORE_WRITER_DIR"
	envWriterSeed = "TINE_CHUNKSTORE_WRITER_SEED"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(envWriterDir); dir != "" {
		seed, _ := strconv.ParseUint(os.Getenv(envWriterSeed), 10, 64)
		if err := crashWriter(dir, seed); err != nil {
			fmt.Fprintln(os.Stderr, "writer:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// writerData makes the bytes of one object the writer stores: random data
// with repeated parts (for dedup) and zero runs (for holes).
func writerData(r *rand.Rand) []byte {
	n := r.IntN(600 << 10)
	b := randBytes(r.Uint64()%50, n) // only 50 distinct streams: much dedup
	if n > 0 && r.IntN(2) == 0 {
		off := r.IntN(n)
		clear(b[off:min(n, off+r.IntN(300<<10))])
	}
	if n > 0 && r.IntN(2) == 0 {
		b[r.IntN(n)] ^= byte(1 + r.IntN(255))
	}
	return b
}

// writerPayload describes data for the checker: its length and SHA-256.
func writerPayload(data []byte, refs []Ref) []byte {
	p := binary.LittleEndian.AppendUint64(nil, uint64(len(data)))
	sum := sha256.Sum256(data)
	p = append(p, sum[:]...)
	for _, r := range refs {
		p = binary.LittleEndian.AppendUint32(p, r.Size)
	}
	return p
}

// crashWriter puts data, sets and deletes refs and runs GCs until killed.
// It prints each ref change after it returns ("set NAME ID", "del NAME",
// "setall NAME ID NAME ID" for two refs changed by one UpdateRefs) and
// announces each change before it starts ("try ...", "tryall ...").
func crashWriter(dir string, seed uint64) error {
	s, err := Open(dir, &Options{PackSize: 1 << 20, GCGrace: 200 * time.Millisecond, MinChunk: 4 << 10, AvgChunk: 16 << 10, MaxChunk: 64 << 10})
	if err != nil {
		return err
	}
	return writerLoop(s, seed, os.Stdout, nil)
}

func writerLoop(s *Store, seed uint64, out io.Writer, stop <-chan struct{}) error {
	ctx := context.Background()
	var err error
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.GC(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "writer gc:", err)
				os.Exit(4)
			}
			time.Sleep(time.Duration(seed%7) * time.Millisecond)
		}
	}()
	r := rand.New(rand.NewPCG(seed, 99))
	var mine []string
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		data := writerData(r)
		var refs []Ref
		if i%3 == 2 {
			refs, err = s.PutFixed(ctx, bytes.NewReader(data), 4096)
		} else {
			refs, err = s.PutStream(ctx, bytes.NewReader(data))
		}
		if err != nil {
			return err
		}
		links := make([]ID, len(refs))
		for j := range refs {
			links[j] = refs[j].ID
		}
		node, err := s.PutNode(links, writerPayload(data, refs))
		if errors.Is(err, ErrNotFound) {
			continue // a GC removed a chunk deduplicated longer than GCGrace ago
		}
		if err != nil {
			return err
		}
		name := fmt.Sprintf("snap/%d/%d", seed, i)
		if i%2 == 0 {
			// The new snapshot ref and head move together.
			old, err := s.GetRef("head")
			if err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			fmt.Fprintf(out, "tryall %s %s head %s\n", name, node, node)
			err = s.UpdateRefs(RefUpdate{Name: name, New: node}, RefUpdate{Name: "head", Old: old, New: node})
			if errors.Is(err, ErrNotFound) {
				continue
			} else if err != nil {
				return err
			}
			fmt.Fprintf(out, "setall %s %s head %s\n", name, node, node)
			mine = append(mine, name)
			continue
		}
		fmt.Fprintf(out, "try %s %s\n", name, node)
		if err := s.SetRef(name, ID{}, node); errors.Is(err, ErrNotFound) {
			continue // collected: older than GCGrace
		} else if err != nil {
			return err
		}
		fmt.Fprintf(out, "set %s %s\n", name, node)
		mine = append(mine, name)
		if i%3 == 1 {
			victim := mine[r.IntN(len(mine))]
			if id, err := s.GetRef(victim); err == nil {
				fmt.Fprintf(out, "trydel %s\n", victim)
				if err := s.DeleteRef(victim, id); err != nil {
					return err
				}
				fmt.Fprintf(out, "del %s\n", victim)
			}
		}
		old, err := s.GetRef("head")
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		fmt.Fprintf(out, "try head %s\n", node)
		if err := s.SetRef("head", old, node); errors.Is(err, ErrNotFound) {
			continue
		} else if err != nil {
			return err
		}
		fmt.Fprintf(out, "set head %s\n", node)
	}
}

// refState is what the checker knows of one ref: its last confirmed state
// and a change that may or may not have happened before the kill.
type refState struct {
	confirmed ID // zero: absent
	known     bool
	maybe     *ID // non-nil: an unconfirmed change to this (zero: delete)
}

// TestCrashSafety kills a writer process at 1000 random points of puts,
// ref updates and GCs (60 with -short); after each kill the store must
// pass Verify, every ref reported committed must read back identical, and
// the data it names must read back with the right SHA-256. A fresh store
// is begun every 50 kills, so that each Verify stays quick.
func TestCrashSafety(t *testing.T) {
	runs := 1000
	if testing.Short() {
		runs = 60
	}
	var dir string
	var state map[string]*refState
	rng := rand.New(rand.NewPCG(1, 2))
	var sets, dels int
	for run := range runs {
		if run%50 == 0 {
			dir, state = t.TempDir(), map[string]*refState{}
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envWriterDir+"="+dir, envWriterSeed+"="+strconv.Itoa(run))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		var got []string
		first := true
		// Most kills are timed from the writer's first line, so that a
		// slow start on a busy machine does not make every kill land
		// before any work; one in ten is timed from the start, to land
		// during Open and its recovery.
		delay := time.Duration(20+rng.IntN(300)) * time.Millisecond
		var deadline <-chan time.Time
		if rng.IntN(10) == 0 {
			deadline = time.After(delay)
		}
		guard := time.After(time.Minute)
	wait:
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					break wait
				}
				got = append(got, l)
				if deadline == nil {
					deadline = time.After(delay)
				}
				if first && strings.HasPrefix(l, "set ") {
					first = false
					// A second process must be refused at once, naming the holder.
					_, err := Open(dir, nil)
					if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), strconv.Itoa(cmd.Process.Pid)) {
						cmd.Process.Kill()
						t.Fatalf("Open while the writer runs: %v; want ErrLocked naming pid %d", err, cmd.Process.Pid)
					}
				}
			case <-deadline:
				break wait
			case <-guard:
				break wait
			}
		}
		cmd.Process.Signal(syscall.SIGKILL)
		for l := range lines {
			got = append(got, l)
		}
		werr := cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("run %d: writer ended before the kill: %v\n%s", run, werr, stderr.String())
		}
		var group []string // refs of an UpdateRefs not confirmed before the kill
		for _, l := range got {
			f := strings.Fields(l)
			switch f[0] {
			case "tryall", "setall":
				group = nil
				for k := 1; k+1 < len(f); k += 2 {
					st := state[f[k]]
					if st == nil {
						st = &refState{known: true} // a new name: absent before
						state[f[k]] = st
					}
					id, _ := ParseID(f[k+1])
					if f[0] == "tryall" {
						st.maybe = &id
						group = append(group, f[k])
					} else {
						st.confirmed, st.known, st.maybe = id, true, nil
						sets++
					}
				}
				continue
			}
			st := state[f[1]]
			if st == nil {
				st = &refState{}
				state[f[1]] = st
			}
			switch f[0] {
			case "try":
				id, _ := ParseID(f[2])
				st.maybe = &id
			case "set":
				id, _ := ParseID(f[2])
				st.confirmed, st.known, st.maybe = id, true, nil
				sets++
			case "trydel":
				st.maybe = &ID{}
			case "del":
				st.confirmed, st.known, st.maybe = ID{}, true, nil
				dels++
			}
		}
		checkAtomic(t, run, dir, state, group)
		checkCrashedStore(t, run, dir, state)
	}
	t.Logf("%d runs killed; %d ref sets and %d deletes confirmed and checked", runs, sets, dels)
	if sets < runs/4 {
		t.Fatalf("only %d ref updates confirmed in %d runs: the writer did too little", sets, runs)
	}
}

// checkAtomic checks that an UpdateRefs cut by the kill happened for all
// of its refs or for none: each ref either reads its new value or its
// last confirmed one.
func checkAtomic(t *testing.T, run int, dir string, state map[string]*refState, group []string) {
	t.Helper()
	var applied, skipped []string
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatalf("run %d: reopen after kill: %v", run, err)
	}
	defer s.Close()
	for _, name := range group {
		st := state[name]
		if st.maybe == nil || !st.known || *st.maybe == st.confirmed {
			continue // no way to tell whether this one changed
		}
		id, _ := s.GetRef(name)
		switch id {
		case *st.maybe:
			applied = append(applied, name)
		case st.confirmed:
			skipped = append(skipped, name)
		}
	}
	if len(applied) > 0 && len(skipped) > 0 {
		t.Fatalf("run %d: UpdateRefs cut by the kill applied %v but not %v", run, applied, skipped)
	}
}

func checkCrashedStore(t *testing.T, run int, dir string, state map[string]*refState) {
	t.Helper()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatalf("run %d: reopen after kill: %v", run, err)
	}
	defer s.Close()
	rep, err := s.Verify(context.Background())
	if err != nil || !rep.OK() {
		t.Fatalf("run %d: Verify after kill: %v %v", run, err, rep.Damaged)
	}
	for name, st := range state {
		id, err := s.GetRef(name)
		if errors.Is(err, ErrNotFound) {
			id, err = ID{}, nil
		}
		if err != nil {
			t.Fatalf("run %d: GetRef(%s): %v", run, name, err)
		}
		if st.maybe != nil && id == *st.maybe {
			// The unconfirmed change happened: it is now the state.
			st.confirmed, st.known, st.maybe = id, true, nil
		}
		st.maybe = nil
		if !st.known {
			st.confirmed, st.known = id, true
		}
		if id != st.confirmed {
			t.Fatalf("run %d: ref %s = %s, committed value %s", run, name, short(id), short(st.confirmed))
		}
		if !id.IsZero() {
			checkWriterNode(t, run, s, name, id)
		}
	}
}

func checkWriterNode(t *testing.T, run int, s *Store, name string, id ID) {
	links, payload, err := s.GetNode(id)
	if err != nil {
		t.Fatalf("run %d: ref %s: %v", run, name, err)
	}
	if len(payload) != 40+4*len(links) {
		t.Fatalf("run %d: ref %s: payload of %d bytes for %d links", run, name, len(payload), len(links))
	}
	refs := make([]Ref, len(links))
	for i := range links {
		refs[i] = Ref{ID: links[i], Size: binary.LittleEndian.Uint32(payload[40+4*i:])}
	}
	h := sha256.New()
	n, err := io.Copy(h, s.NewReader(refs))
	if err != nil {
		t.Fatalf("run %d: ref %s: read data: %v", run, name, err)
	}
	if uint64(n) != binary.LittleEndian.Uint64(payload) || !bytes.Equal(h.Sum(nil), payload[8:40]) {
		t.Fatalf("run %d: ref %s: data read back differs", run, name)
	}
}
