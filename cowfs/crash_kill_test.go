package cowfs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tine/chunkstore"
)

var (
	crashSeed  = flag.Uint64("crash.seed", 0, "TestCrashKill: seed of the first kill of each scenario (0: from the clock)")
	crashKills = flag.Int("crash.kills", 0, "TestCrashKill: kills per scenario (0: the scenario's own count)")
)

// crashStoreOptions are the store options of both sides of TestCrashKill:
// small packs so that GC deletes and rewrites packs, and a short grace so
// that it collects what deleted snapshots held.
var crashStoreOptions = &Options{Store: &chunkstore.Options{PackSize: 256 << 10, GCGrace: 500 * time.Millisecond}}

// crashScenario is one kind of work that TestCrashKill kills a process in.
// The child runs the work, printing one line per step before and after it
// (see crashLog); the parent kills it at a seeded random time and checks
// the state root against what the lines acknowledged.
type crashScenario struct {
	name        string
	kills       int           // kills in the full run
	short       int           // kills with -short
	maxDelay    time.Duration // the kill comes uniformly within this after READY
	calibrate   bool          // a first run waits for DONE and sets maxDelay from it
	patternData bool          // every file at the top of every branch is a pattern prefix
	child       func(c *crashChildRun) error
	check       func(t *testing.T, k *crashKill) // more checks after the common ones
}

var crashScenarios = []crashScenario{
	{name: "snapshot", kills: 40, short: 6, maxDelay: time.Second, patternData: true, child: crashSnapshotChild},
	{name: "rollback", kills: 35, short: 5, maxDelay: time.Second, patternData: true,
		child: seqChild(map[string]int{"write": 4, "fsync": 1, "snapshot": 2, "rollback": 4})},
	{name: "unmount", kills: 35, short: 5, maxDelay: time.Second, patternData: true,
		child: seqChild(map[string]int{"write": 4, "fsync": 1, "remount": 3})},
	{name: "gc", kills: 35, short: 5, maxDelay: 1500 * time.Millisecond, patternData: true,
		child: crashGCChild},
	{name: "promote", kills: 35, short: 5, calibrate: true, child: crashPromoteChild, check: checkPromote},
	{name: "branch", kills: 40, short: 6, maxDelay: time.Second, patternData: true,
		child: crashBranchChild, check: checkPoolAfterCrash},
}

// TestCrashKill SIGKILLs a process of the filesystem at many points of
// snapshot, rollback, unmount, GC, promote and branch/fork/delete, then
// reopens the root and checks that nothing acknowledged was lost.
func TestCrashKill(t *testing.T) {
	needFUSE(t)
	seed := *crashSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()) % 1e9
	}
	fmt.Printf("TestCrashKill: -crash.seed=%d\n", seed)
	t.Logf("seed %d (rerun with -crash.seed=%d; one kill: -crash.seed=SEED -crash.kills=1)", seed, seed)
	start := time.Now()
	total := 0
	for i := range crashScenarios {
		sc := crashScenarios[i]
		n := sc.kills
		if testing.Short() {
			n = sc.short
		}
		if *crashKills > 0 {
			n = *crashKills
		}
		t.Run(sc.name, func(t *testing.T) {
			if sc.calibrate {
				// A first run, killed only when done, measures the work.
				if !runCrashKill(t, &sc, seed^0xca1, true) {
					t.Fatalf("%s: the run to completion failed", sc.name)
				}
				total++
			}
			for k := 0; k < n; k++ {
				s := seed + uint64(k)
				if !runCrashKill(t, &sc, s, false) {
					t.Fatalf("%s: kill %d failed; reproduce with -run 'TestCrashKill/%s' -crash.seed=%d -crash.kills=1", sc.name, k, sc.name, s)
				}
				total++
			}
		})
	}
	t.Logf("%d kills in %v", total, time.Since(start).Round(time.Millisecond))
}

// crashKill is one killed run as the parent sees it afterwards.
type crashKill struct {
	sc   *crashScenario
	seed uint64
	root string
	work string
	f    *FS // the root reopened
	log  *crashLog
}

// runCrashKill runs one child of scenario sc, kills it and checks the
// root. With measure it kills the child when its work is done and sets
// sc.maxDelay to the time the work took. It reports whether every check
// passed.
func runCrashKill(t *testing.T, sc *crashScenario, seed uint64, measure bool) bool {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	k := &crashKill{sc: sc, seed: seed, root: filepath.Join(dir, "root"), work: filepath.Join(dir, "work")}
	if err := os.MkdirAll(k.work, 0o755); err != nil {
		t.Fatal(err)
	}
	defer detachUnder(t, k.work)
	fail := func(format string, a ...any) {
		t.Helper()
		t.Errorf("%s seed %d: %s", sc.name, seed, fmt.Sprintf(format, a...))
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=kill %s %s %s %d", crashEnv, sc.name, k.root, k.work, seed))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	ready, done := make(chan time.Time, 1), make(chan time.Time, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			l := sc.Text()
			mu.Lock()
			lines = append(lines, l)
			mu.Unlock()
			switch {
			case l == "READY":
				ready <- time.Now()
			case strings.HasPrefix(l, "DONE"):
				done <- time.Now()
			}
		}
	}()
	var readyAt time.Time
	select {
	case readyAt = <-ready:
	case <-readDone:
	case <-time.After(60 * time.Second):
	}
	if readyAt.IsZero() {
		conns := fuseConnsUnder(k.work)
		cmd.Process.Kill()
		abortFUSE(t, conns)
		cmd.Wait()
		<-readDone
		fail("child never became ready; it printed %q", lines)
		return false
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	var delay time.Duration
	if measure {
		select {
		case at := <-done:
			sc.maxDelay = at.Sub(readyAt) * 6 / 5
			t.Logf("%s: the work took %v; kills come within %v", sc.name, at.Sub(readyAt), sc.maxDelay)
		case <-time.After(120 * time.Second):
			fail("the work did not finish in 120s")
		}
	} else {
		delay = time.Duration(rng.Int64N(int64(sc.maxDelay) + 1))
		time.Sleep(delay)
	}
	conns := fuseConnsUnder(k.work)
	cmd.Process.Signal(syscall.SIGKILL)
	abortFUSE(t, conns)
	cmd.Wait()
	<-readDone
	detachUnder(t, k.work)
	k.log = parseCrashLog(lines)
	t.Logf("seed %d: killed %v after READY, %d lines, in flight %v, last %q, GCs %d %q", seed, delay.Round(time.Microsecond),
		len(lines), k.log.plan, tail(lines, 1), len(k.log.extra["GC"]), tail(k.log.extra["GC"], 1))
	for _, e := range k.log.errs {
		fail("child: %s", e)
	}

	k.f, err = Open(k.root, crashStoreOptions)
	if err != nil {
		fail("reopen after the kill: %v", err)
		return false
	}
	defer k.f.Close()
	rep, err := k.f.Store().Verify(ctx)
	if err != nil {
		fail("verify: %v", err)
	} else if !rep.OK() {
		fail("store verify after the kill: %v", rep.Damaged)
	}
	for _, e := range checkCrashModel(ctx, k) {
		fail("%s", e)
	}
	if sc.check != nil {
		sc.check(t, k)
	}
	if ms := mountsUnder(t, k.work); len(ms) > 0 {
		fail("mounts left behind: %q", ms)
	}
	if t.Failed() {
		t.Logf("%s seed %d: child said:\n%s", sc.name, seed, tail(lines, 40))
	}
	return !t.Failed()
}

func tail(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// crashLog is what the child acknowledged, read from its lines:
//
//	SNAP id state       a snapshot was taken and holds state
//	UNSNAP id           deleting the snapshot begins
//	DELSNAP id          the snapshot was deleted
//	PLAN branch state   a step that makes the branch's durable state this begins
//	ACK branch state    that step returned: the branch's durable state is this
//	SYNC branch file n  fsync returned with file at least n bytes long
//	ERR text            the child found something wrong
//
// A state is "name=len,..." for the files at the top of a branch, or "!"
// for a branch that does not exist.
type crashLog struct {
	snaps   map[string]string // id -> state, acknowledged
	deleted map[string]bool   // id -> deleted since its last SNAP
	unsnap  string            // id of a snapshot deletion in flight
	ack     map[string]string // branch -> last acknowledged state
	plan    map[string]string // branch -> state of a step in flight
	minLen  map[string]map[string]int64
	errs    []string
	extra   map[string][]string // other lines by first word
}

func parseCrashLog(lines []string) *crashLog {
	l := &crashLog{snaps: map[string]string{}, deleted: map[string]bool{}, ack: map[string]string{},
		plan: map[string]string{}, minLen: map[string]map[string]int64{}, extra: map[string][]string{}}
	for _, line := range lines {
		w := strings.Fields(line)
		if len(w) == 0 {
			continue
		}
		switch {
		case w[0] == "SNAP" && len(w) == 3:
			l.snaps[w[1]] = w[2]
			delete(l.deleted, w[1])
		case w[0] == "UNSNAP" && len(w) == 2:
			l.unsnap = w[1]
		case w[0] == "DELSNAP" && len(w) == 2:
			l.deleted[w[1]] = true
			l.unsnap = ""
		case w[0] == "PLAN" && len(w) == 3:
			l.plan[w[1]] = w[2]
		case w[0] == "ACK" && len(w) == 3:
			l.ack[w[1]] = w[2]
			delete(l.plan, w[1])
		case w[0] == "SYNC" && len(w) == 4:
			n, _ := strconv.ParseInt(w[3], 10, 64)
			if l.minLen[w[1]] == nil {
				l.minLen[w[1]] = map[string]int64{}
			}
			l.minLen[w[1]][w[2]] = max(l.minLen[w[1]][w[2]], n)
		case w[0] == "ERR":
			l.errs = append(l.errs, line)
		default:
			l.extra[w[0]] = append(l.extra[w[0]], line)
		}
	}
	return l
}

// checkCrashModel checks the reopened root against the log: snapshots,
// branch heads, fsync'd lengths, file contents, and that every branch
// mounts again and reads as its head.
func checkCrashModel(ctx context.Context, k *crashKill) []string {
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	f, l := k.f, k.log
	for id, st := range l.snaps {
		sid, err := chunkstore.ParseID(id)
		if err != nil {
			bad("bad id %q in log", id)
			continue
		}
		_, rerr := f.Resolve(ctx, id)
		if l.deleted[id] {
			inFlight := false
			for _, p := range l.plan {
				inFlight = inFlight || p == st
			}
			if rerr == nil && !inFlight {
				bad("snapshot %s was deleted before the kill but is still there", id)
			}
			continue
		}
		if rerr != nil {
			if id != l.unsnap {
				bad("snapshot %s taken before the kill: %v", id, rerr)
			}
			continue
		}
		got, files, err := snapState(f, sid)
		if err != nil {
			bad("read snapshot %s: %v", id, err)
		} else if got != st {
			bad("snapshot %s holds %s, held %s when taken", id, got, st)
		}
		if k.sc.patternData {
			errs = append(errs, checkPatterns("snapshot "+id, files)...)
		}
	}
	bs, _, err := f.List(ctx)
	if err != nil {
		return append(errs, fmt.Sprintf("list: %v", err))
	}
	listed := map[string]BranchInfo{}
	for _, b := range bs {
		listed[b.Name] = b
		if b.Mounted {
			bad("branch %s is mounted after reopening", b.Name)
		}
		if _, ok := l.ack[b.Name]; !ok && l.plan[b.Name] == "" && len(l.minLen[b.Name]) == 0 {
			bad("branch %s exists but was never made", b.Name)
		}
	}
	for _, name := range union(l.ack, l.plan) {
		got := "!"
		if b, ok := listed[name]; ok {
			st, _, err := snapState(f, b.Head)
			if err != nil {
				bad("read head of %s: %v", name, err)
				continue
			}
			got = st
		}
		a, acked := l.ack[name]
		if !acked {
			a = "!"
		}
		if p, ok := l.plan[name]; got != a && !(ok && got == p) {
			bad("branch %s is at %s; acknowledged %s, in flight %q", name, got, a, p)
		}
	}
	for name, files := range l.minLen {
		b, ok := listed[name]
		if !ok {
			bad("branch %s with fsync'd data is gone", name)
			continue
		}
		_, data, err := snapState(f, b.Head)
		if err != nil {
			bad("read head of %s: %v", name, err)
			continue
		}
		for fn, n := range files {
			if int64(len(data[fn])) < n {
				bad("branch %s: %s has %d bytes after the kill, %d were fsync'd", name, fn, len(data[fn]), n)
			}
		}
	}
	for _, b := range bs {
		_, files, err := snapState(f, b.Head)
		if err != nil {
			bad("read head of %s: %v", b.Name, err)
			continue
		}
		if k.sc.patternData {
			errs = append(errs, checkPatterns("branch "+b.Name, files)...)
		}
		if err := remountReads(ctx, f, b.Name, filepath.Join(k.work, "again-"+b.Name), files); err != nil {
			bad("remount %s: %v", b.Name, err)
		}
	}
	return errs
}

func union(a, b map[string]string) []string {
	var out []string
	for n := range a {
		out = append(out, n)
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// remountReads mounts branch name at dir and checks that its top-level
// files read as want.
func remountReads(ctx context.Context, f *FS, name, dir string, want map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	m, err := f.Mount(ctx, name, dir, nil)
	if err != nil {
		return err
	}
	var errs []error
	for fn, data := range want {
		got, err := os.ReadFile(filepath.Join(dir, fn))
		if err != nil {
			errs = append(errs, err)
		} else if !bytes.Equal(got, data) {
			errs = append(errs, fmt.Errorf("%s reads %d bytes through the mount, the head holds %d (or other bytes)", fn, len(got), len(data)))
		}
	}
	return errors.Join(append(errs, m.Unmount())...)
}

// snapState reads the top-level files of snapshot id: its state string and
// the files' contents.
func snapState(f *FS, id SnapshotID) (string, map[string][]byte, error) {
	tree, err := readSnapTree(f, id)
	if err != nil {
		return "", nil, err
	}
	files := map[string][]byte{}
	lens := state{}
	for p, e := range tree {
		if e.typ == TypeFile && !strings.Contains(p, "/") {
			files[p] = []byte(e.data)
			lens[p] = int64(len(e.data))
		}
	}
	return stateOf(lens), files, nil
}

// stateOf encodes the lengths of files as "name=len,..." sorted by name.
func stateOf(lens map[string]int64) string {
	var parts []string
	for n, l := range lens {
		parts = append(parts, fmt.Sprintf("%s=%d", n, l))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

// treeNode is one entry of a tree as the crash checks compare it.
type treeNode struct {
	typ    EntryType
	data   string // file content
	target string // symlink target
}

// readSnapTree reads every entry of snapshot id, by slash-separated path.
func readSnapTree(f *FS, id SnapshotID) (map[string]treeNode, error) {
	top, err := f.rootEntry(id)
	if err != nil {
		return nil, err
	}
	out := map[string]treeNode{}
	var walk func(prefix string, dir SnapshotID) error
	walk = func(prefix string, dir SnapshotID) error {
		es, err := getDir(f.store, dir)
		if err != nil {
			return err
		}
		for i := range es {
			e := &es[i]
			p := prefix + e.Name
			n := treeNode{typ: e.Type, target: e.Target}
			switch e.Type {
			case TypeDir:
				if err := walk(p+"/", e.ID); err != nil {
					return err
				}
			case TypeFile:
				r, err := f.contentReader(e)
				if err != nil {
					return err
				}
				b, err := io.ReadAll(r)
				if err != nil {
					return fmt.Errorf("read %s: %w", p, err)
				}
				n.data = string(b)
			}
			out[p] = n
		}
		return nil
	}
	return out, walk("", top.ID)
}

// readHostTree reads every entry under dir, by slash-separated path.
func readHostTree(dir string) (map[string]treeNode, error) {
	out := map[string]treeNode{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var n treeNode
		switch {
		case d.IsDir():
			n.typ = TypeDir
		case d.Type()&os.ModeSymlink != 0:
			n.typ = TypeSymlink
			n.target, err = os.Readlink(p)
		case d.Type().IsRegular():
			n.typ = TypeFile
			var b []byte
			b, err = os.ReadFile(p)
			n.data = string(b)
		default:
			n.typ = TypeFifo
		}
		out[filepath.ToSlash(rel)] = n
		return err
	})
	return out, err
}

// patternSeed is the seed of the pattern a file of that name holds.
func patternSeed(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// maxPattern bounds the files the workloads write.
const maxPattern = 4 << 20

var patterns sync.Map // name -> []byte of maxPattern bytes

func patternOf(name string) []byte {
	if p, ok := patterns.Load(name); ok {
		return p.([]byte)
	}
	p, _ := patterns.LoadOrStore(name, pattern(patternSeed(name), maxPattern))
	return p.([]byte)
}

// checkPatterns reports files that are not a prefix of their pattern.
func checkPatterns(what string, files map[string][]byte) []string {
	var errs []string
	for n, d := range files {
		if p := patternOf(n); len(d) > len(p) || !bytes.Equal(d, p[:len(d)]) {
			errs = append(errs, fmt.Sprintf("%s: %s (%d bytes) is not what was written", what, n, len(d)))
		}
	}
	return errs
}

// detachUnder lazily unmounts what a killed process left mounted below
// dir, deepest first.
func detachUnder(t *testing.T, dir string) {
	ms := mountsUnder(t, dir)
	sort.Sort(sort.Reverse(sort.StringSlice(ms)))
	for _, m := range ms {
		unix.Unmount(m, unix.MNT_DETACH)
	}
}

// fuseConnsUnder returns the FUSE connection numbers (device minors) of
// the mounts below dir.
func fuseConnsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		w := strings.Fields(line)
		if len(w) > 4 && strings.HasPrefix(w[4], dir+"/") && strings.HasPrefix(w[2], "0:") {
			out = append(out, strings.TrimPrefix(w[2], "0:"))
		}
	}
	return out
}

// abortFUSE aborts FUSE connections through the fuse control filesystem
// (mounting it when it is not). A child that reads and writes its own
// mount cannot finish dying otherwise: a thread waiting for the answer to
// a request already sent waits even through SIGKILL, and the answer would
// come from the dying process itself.
func abortFUSE(t *testing.T, conns []string) {
	const ctl = "/sys/fs/fuse/connections"
	if len(conns) == 0 {
		return
	}
	if m, _ := os.ReadFile("/proc/self/mounts"); !strings.Contains(string(m), " "+ctl+" ") {
		if err := unix.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil {
			t.Logf("mount fusectl: %v", err)
		}
	}
	for _, c := range conns {
		os.WriteFile(filepath.Join(ctl, c, "abort"), []byte("1"), 0)
	}
}

// --- the child side ---

// crashChildRun is the state of a child of TestCrashKill.
type crashChildRun struct {
	ctx  context.Context
	f    *FS
	work string
	rng  *rand.Rand
	mu   sync.Mutex
}

// killChild runs scenario args[0] on root args[1], work dir args[2] with
// seed args[3] until it is killed.
func killChild(args []string) {
	if len(args) != 4 {
		fmt.Println("ERR want: scenario root work seed")
		return
	}
	seed, _ := strconv.ParseUint(args[3], 10, 64)
	c := &crashChildRun{ctx: context.Background(), work: args[2], rng: rand.New(rand.NewPCG(seed, 2))}
	var err error
	if c.f, err = Open(args[1], crashStoreOptions); err != nil {
		c.say("ERR open: %v", err)
		return
	}
	for _, sc := range crashScenarios {
		if sc.name == args[0] {
			if err := sc.child(c); err != nil {
				c.say("ERR %v", err)
			}
			c.say("DONE")
			select {} // wait to be killed
		}
	}
	c.say("ERR no scenario %q", args[0])
}

// say writes one line to the parent; a line is one write to a pipe, so it
// arrives whole or not at all.
func (c *crashChildRun) say(format string, a ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	os.Stdout.WriteString(fmt.Sprintf(format, a...) + "\n")
}

// crashFiles are the files of the branch workloads.
var crashFiles = []string{"f0", "f1", "f2", "f3"}

// state is the lengths of a branch's files as the child wrote them.
type state map[string]int64

func (s state) String() string { return stateOf(s) }

func (s state) clone() state {
	c := state{}
	for n, l := range s {
		c[n] = l
	}
	return c
}

// importState imports files holding their patterns up to the lengths in s
// as a snapshot and says SNAP.
func (c *crashChildRun) importState(s state) (SnapshotID, error) {
	src, err := os.MkdirTemp(c.work, "src")
	if err != nil {
		return SnapshotID{}, err
	}
	for n, l := range s {
		if err := os.WriteFile(filepath.Join(src, n), patternOf(n)[:l], 0o644); err != nil {
			return SnapshotID{}, err
		}
	}
	id, err := c.f.Import(c.ctx, src, "")
	if err != nil {
		return id, err
	}
	c.say("SNAP %s %s", id, s)
	return id, nil
}

// newBranch imports s and makes branch name from it. With exact, the
// branch's durable state is known at every step (PLAN and ACK); without,
// only lower bounds of its files' lengths are (SYNC).
func (c *crashChildRun) newBranch(name string, s state, exact bool) (SnapshotID, error) {
	id, err := c.importState(s)
	if err != nil {
		return id, err
	}
	if exact {
		c.say("PLAN %s %s", name, s)
	}
	if err := c.f.Branch(c.ctx, id, name); err != nil {
		return id, err
	}
	if exact {
		c.say("ACK %s %s", name, s)
	}
	for n, l := range s {
		c.say("SYNC %s %s %d", name, n, l)
	}
	return id, nil
}

func (c *crashChildRun) mount(name string) (*Mount, error) {
	dir := filepath.Join(c.work, "mnt-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return c.f.Mount(c.ctx, name, dir, nil)
}

// appendTo writes the next n bytes of file name's pattern at offset
// s[name] through the mount at dir and records the new length in s.
func (c *crashChildRun) appendTo(dir, name string, s state, n int64) error {
	off := s[name]
	if off+n > maxPattern {
		return nil
	}
	fh, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = fh.WriteAt(patternOf(name)[off:off+n], off)
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("append to %s: %w", name, err)
	}
	s[name] = off + n
	return nil
}

// fsync fsyncs file name through the mount at dir.
func fsync(dir, name string) error {
	fh, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = fh.Sync()
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}

// stream appends to file name of the branch mounted at dir until the
// pattern is used up, fsyncing every few writes and saying SYNC.
func (c *crashChildRun) stream(branch, dir, name string, synced *int64) error {
	fh, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer fh.Close()
	p := patternOf(name)
	off := 0
	for i := 0; off+64<<10 < len(p); i++ {
		n := 4096 + i%11*2000
		if _, err := fh.WriteAt(p[off:off+n], int64(off)); err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		off += n
		if i%4 == 3 {
			if err := fh.Sync(); err != nil {
				return fmt.Errorf("fsync %s: %w", name, err)
			}
			c.mu.Lock()
			*synced = int64(off)
			c.mu.Unlock()
			c.say("SYNC %s %s %d", branch, name, off)
		}
	}
	return nil
}

func initialState() state { return state{"f0": 20 << 10, "f1": 100 << 10, "f2": 1, "f3": 0} }

// crashSnapshotChild snapshots the mounted branch main over and over
// while one goroutine streams into it and the snapshotting one appends to
// other files between snapshots.
func crashSnapshotChild(c *crashChildRun) error {
	cur := initialState()
	if _, err := c.newBranch("main", cur, false); err != nil {
		return err
	}
	m, err := c.mount("main")
	if err != nil {
		return err
	}
	var synced int64
	go func() {
		if err := c.stream("main", m.Dir(), "s", &synced); err != nil {
			c.say("ERR %v", err)
		}
	}()
	c.say("READY")
	for {
		fn := crashFiles[c.rng.IntN(len(crashFiles))]
		if err := c.appendTo(m.Dir(), fn, cur, 1+c.rng.Int64N(40<<10)); err != nil {
			return err
		}
		c.mu.Lock()
		minS := synced
		c.mu.Unlock()
		id, err := c.f.Snapshot(c.ctx, "main")
		if err != nil {
			return err
		}
		st, files, err := snapState(c.f, id)
		if err != nil {
			return err
		}
		got := state{}
		for n, d := range files {
			got[n] = int64(len(d))
		}
		c.say("SNAP %s %s", id, st)
		for _, n := range crashFiles {
			if got[n] != cur[n] {
				c.say("ERR snapshot %s: %s has %d bytes, the branch had %d", id, n, got[n], cur[n])
			}
		}
		if got["s"] < minS {
			c.say("ERR snapshot %s: s has %d bytes, %d were fsync'd before it", id, got["s"], minS)
		}
		c.say("SYNC main %s %d", fn, cur[fn])
	}
}

// seqWork is a single-threaded workload on the mounted branch main whose
// every durable state is known: the child says PLAN before each step that
// moves the branch's durable state and ACK after it.
type seqWork struct {
	c     *crashChildRun
	m     *Mount
	cur   state
	snaps []seqSnap // snapshots that may be rolled back to
}

type seqSnap struct {
	id SnapshotID
	st state
}

// seqChild returns a child that runs steps drawn with the given weights.
func seqChild(weights map[string]int) func(c *crashChildRun) error {
	return func(c *crashChildRun) error {
		w, err := newSeqWork(c)
		if err != nil {
			return err
		}
		c.say("READY")
		for {
			if err := w.step(pickWeighted(c.rng, weights)); err != nil {
				return err
			}
		}
	}
}

func newSeqWork(c *crashChildRun) (*seqWork, error) {
	w := &seqWork{c: c, cur: initialState()}
	id, err := c.newBranch("main", w.cur, true)
	if err != nil {
		return nil, err
	}
	w.snaps = append(w.snaps, seqSnap{id, w.cur.clone()})
	w.m, err = c.mount("main")
	return w, err
}

func pickWeighted(rng *rand.Rand, weights map[string]int) string {
	var names []string
	total := 0
	for n, w := range weights {
		names = append(names, n)
		total += w
	}
	sort.Strings(names)
	x := rng.IntN(total)
	for _, n := range names {
		if x < weights[n] {
			return n
		}
		x -= weights[n]
	}
	panic("unreachable")
}

func (w *seqWork) step(op string) error {
	c := w.c
	switch op {
	case "write":
		fn := crashFiles[c.rng.IntN(len(crashFiles))]
		return c.appendTo(w.m.Dir(), fn, w.cur, 1+c.rng.Int64N(48<<10))
	case "fsync":
		c.say("PLAN main %s", w.cur)
		if err := fsync(w.m.Dir(), "f0"); err != nil {
			return err
		}
		c.say("ACK main %s", w.cur)
	case "snapshot":
		c.say("PLAN main %s", w.cur)
		id, err := c.f.Snapshot(c.ctx, "main")
		if err != nil {
			return err
		}
		c.say("SNAP %s %s", id, w.cur)
		c.say("ACK main %s", w.cur)
		w.snaps = append(w.snaps, seqSnap{id, w.cur.clone()})
	case "rollback":
		s := w.snaps[c.rng.IntN(len(w.snaps))]
		c.say("PLAN main %s", s.st)
		if err := c.f.Rollback(c.ctx, "main", s.id); err != nil {
			return err
		}
		c.say("ACK main %s", s.st)
		w.cur = s.st.clone()
	case "remount":
		c.say("PLAN main %s", w.cur)
		if err := w.m.Unmount(); err != nil {
			return err
		}
		c.say("ACK main %s", w.cur)
		var err error
		w.m, err = c.mount("main")
		return err
	case "delsnap":
		if len(w.snaps) < 2 {
			return nil
		}
		i := 1 + c.rng.IntN(len(w.snaps)-1)
		id := w.snaps[i].id
		c.say("UNSNAP %s", id)
		if err := c.f.DeleteSnapshot(c.ctx, id); err != nil {
			return err
		}
		c.say("DELSNAP %s", id)
		kept := w.snaps[:0]
		for _, s := range w.snaps {
			if s.id != id {
				kept = append(kept, s)
			}
		}
		w.snaps = kept
	case "junk":
		// A snapshot of data no other holds, for delsnap to make garbage of.
		id, err := c.importState(state{fmt.Sprintf("j%d", c.rng.IntN(8)): 100<<10 + c.rng.Int64N(300<<10)})
		if err != nil {
			return err
		}
		w.snaps = append(w.snaps, seqSnap{id, nil})
	case "gc":
		st, err := c.f.Store().GC(c.ctx)
		if err != nil {
			return err
		}
		c.say("GC live=%d deleted=%d packs-deleted=%d repacked=%d", st.Live, st.Deleted, st.PacksDeleted, st.PacksRepacked)
	default:
		return fmt.Errorf("no step %q", op)
	}
	return nil
}

// crashGCChild collects the store again and again while branch main takes
// writes, fsyncs, snapshots and snapshot deletions and branch side, also
// mounted, takes a stream of writes.
func crashGCChild(c *crashChildRun) error {
	w, err := newSeqWork(c)
	if err != nil {
		return err
	}
	if _, err := c.newBranch("side", state{"f0": 1000}, false); err != nil {
		return err
	}
	side, err := c.mount("side")
	if err != nil {
		return err
	}
	var synced int64
	go func() {
		if err := c.stream("side", side.Dir(), "s", &synced); err != nil {
			c.say("ERR %v", err)
		}
	}()
	// Make garbage older than the grace so that the first GCs delete.
	for i := 0; i < 6; i++ {
		for _, op := range []string{"write", "write", "snapshot", "junk"} {
			if err := w.step(op); err != nil {
				return err
			}
		}
	}
	for i := 0; i < 8; i++ {
		if err := w.step("delsnap"); err != nil {
			return err
		}
	}
	time.Sleep(crashStoreOptions.Store.GCGrace)
	c.say("READY")
	weights := map[string]int{"write": 4, "fsync": 1, "snapshot": 2, "junk": 1, "delsnap": 2, "gc": 3}
	for {
		if err := w.step(pickWeighted(c.rng, weights)); err != nil {
			return err
		}
	}
}

// crashBranchChild creates and deletes branches, and forks, writes into,
// snapshots and unmounts forks from a mount pool. A fork is acknowledged
// only by its snapshot: until then it may be lost.
func crashBranchChild(c *crashChildRun) error {
	base := initialState()
	id, err := c.importState(base)
	if err != nil {
		return err
	}
	snaps := []seqSnap{{id, base}}
	pool, err := c.f.NewMountPool(c.ctx, filepath.Join(c.work, "pool"), 2, nil)
	if err != nil {
		return err
	}
	exists := map[string]bool{}
	c.say("READY")
	for {
		name := fmt.Sprintf("%c%d", "bf"[c.rng.IntN(2)], c.rng.IntN(3))
		if exists[name] {
			c.say("PLAN %s !", name)
			if err := c.f.DeleteBranch(c.ctx, name); err != nil {
				return err
			}
			c.say("ACK %s !", name)
			exists[name] = false
			continue
		}
		s := snaps[c.rng.IntN(len(snaps))]
		c.say("PLAN %s %s", name, s.st)
		if name[0] == 'b' {
			if err := c.f.Branch(c.ctx, s.id, name); err != nil {
				return err
			}
			c.say("ACK %s %s", name, s.st)
			exists[name] = true
			continue
		}
		m, err := pool.Fork(c.ctx, s.id, name)
		if err != nil {
			return err
		}
		// No ACK: the fork's branch is deferred (ADR 0190), durable with
		// the snapshot below; a kill before it may leave no branch.
		exists[name] = true
		cur := s.st.clone()
		if err := c.appendTo(m.Dir(), crashFiles[c.rng.IntN(len(crashFiles))], cur, 1+c.rng.Int64N(32<<10)); err != nil {
			return err
		}
		c.say("PLAN %s %s", name, cur)
		id, err := c.f.Snapshot(c.ctx, name)
		if err != nil {
			return err
		}
		c.say("SNAP %s %s", id, cur)
		c.say("ACK %s %s", name, cur)
		snaps = append(snaps, seqSnap{id, cur})
		if err := m.Unmount(); err != nil {
			return err
		}
	}
}

// checkPoolAfterCrash makes a mount pool where the killed process had
// one, forks from it and closes it: nothing the killed pool left may get
// in the way, and no spare state directory may stay behind.
func checkPoolAfterCrash(t *testing.T, k *crashKill) {
	ctx := context.Background()
	_, ss, err := k.f.List(ctx)
	if err != nil || len(ss) == 0 {
		t.Errorf("branch seed %d: list snapshots: %v (%d)", k.seed, err, len(ss))
		return
	}
	pool, err := k.f.NewMountPool(ctx, filepath.Join(k.work, "pool"), 1, nil)
	if err != nil {
		t.Errorf("branch seed %d: new pool after the kill: %v", k.seed, err)
		return
	}
	m, err := pool.Fork(ctx, ss[0].ID, "after")
	if err == nil {
		err = os.WriteFile(filepath.Join(m.Dir(), "new"), []byte("x"), 0o644)
		err = errors.Join(err, m.Unmount())
	}
	err = errors.Join(err, pool.Close())
	if err != nil {
		t.Errorf("branch seed %d: fork after the kill: %v", k.seed, err)
	}
	if olds, _ := filepath.Glob(filepath.Join(k.root, "branches", sparePrefix+"*")); len(olds) > 0 {
		t.Errorf("branch seed %d: spare state directories left: %q", k.seed, olds)
	}
}
