package quiet

import (
	"testing"
	"time"
)

func TestParseCPULine(t *testing.T) {
	idle, total, ok := parseCPULine([]byte("cpu  100 5 50 800 20 1 2 3 40 0\n"))
	if !ok || idle != 820 || total != 981 {
		t.Fatalf("got idle %d total %d ok %v, want 820 981 true", idle, total, ok)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5\n", "cpu 1 2 x 4 5\n", "cpu 1 2\n", "intr 1 2 3 4 5\n"} {
		if _, _, ok := parseCPULine([]byte(bad)); ok {
			t.Errorf("parseCPULine(%q) accepted", bad)
		}
	}
}

func TestRoomFor(t *testing.T) {
	for _, c := range []struct {
		idle, total uint64
		ncpu        int
		want        bool
	}{
		{50, 100, 2, true},  // one of two CPUs idle
		{10, 100, 2, false}, // both busy
		{10, 100, 16, true}, // more than one of 16 idle
		{5, 100, 16, false}, // less than one of 16
		{100, 100, 1, true}, // the only CPU idle
		{80, 100, 1, false}, // the only CPU a fifth busy
	} {
		if got := roomFor(c.idle, c.total, c.ncpu); got != c.want {
			t.Errorf("roomFor(%d, %d, %d) = %v, want %v", c.idle, c.total, c.ncpu, got, c.want)
		}
	}
}

// fakeCPU makes readCPU report 2 CPUs whose idle share of each tick
// step is idleShare, and counts the reads.
func fakeCPU(t *testing.T, idleShare uint64) *int {
	reads := 0
	old, oldN := readCPU, numCPU
	t.Cleanup(func() { readCPU, numCPU = old, oldN })
	numCPU = func() int { return 2 }
	readCPU = func() (uint64, uint64, bool) {
		reads++
		return uint64(reads) * idleShare, uint64(reads) * 100, true
	}
	return &reads
}

// TestWaitBusy: with both CPUs busy, Wait holds on until max and then
// returns true; a closed stop ends it at once with false.
func TestWaitBusy(t *testing.T) {
	reads := fakeCPU(t, 10)
	start := time.Now()
	if !Wait(nil, 200*time.Millisecond) {
		t.Fatal("Wait returned false with no stop")
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("Wait returned after %v with every CPU busy, want the max of 200ms", d)
	}
	if *reads < 3 {
		t.Errorf("Wait read the CPU times %d times in 200ms, want one a Window", *reads)
	}
	stop := make(chan struct{})
	close(stop)
	if Wait(stop, time.Second) {
		t.Error("Wait returned true with stop closed")
	}
}

// TestWaitIdle: with a CPU idle, Wait returns after one Window.
func TestWaitIdle(t *testing.T) {
	reads := fakeCPU(t, 60)
	Wait(nil, time.Hour)
	if *reads != 2 {
		t.Errorf("Wait read the CPU times %d times with a CPU idle, want 2 (one Window)", *reads)
	}
}

// TestCPUTimes reads this host's /proc/stat.
func TestCPUTimes(t *testing.T) {
	idle, total, ok := cpuTimes()
	if !ok || total == 0 || idle > total {
		t.Fatalf("cpuTimes() = %d, %d, %v", idle, total, ok)
	}
}
