package procfs

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestProcessSelf(t *testing.T) {
	p, err := Default().Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.PPID != os.Getppid() || p.Argv[0] != os.Args[0] || p.UID != uint32(os.Getuid()) || p.State == "" ||
		p.RSS == 0 || time.Since(p.Start) > time.Hour || time.Since(p.Start) < 0 {
		t.Fatalf("%+v", p)
	}
}

func TestParseStatCommWithParens(t *testing.T) {
	p, err := parseStat(5, []byte("5 (a) b (c)) S 1 5 5 0 -1 4194560 0 0 0 0 250 50 0 0 20 0 1 0 300 0 0"))
	if err != nil || p.Comm != "a) b (c)" || p.State != "S" || p.PPID != 1 || p.CPUTime != 3*time.Second || p.Start.Sub(time.Time{}) != 3*time.Second {
		t.Fatalf("%+v %v", p, err)
	}
}

func TestPortsUDPAndTCP6(t *testing.T) {
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	l6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l6.Close()
	ports, err := Default().Ports()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"udp 127.0.0.1 " + portOf(u.LocalAddr()): false,
		"tcp6 ::1 " + portOf(l6.Addr()):          false,
	}
	for _, p := range ports {
		k := p.Proto + " " + p.Address + " " + strconv.Itoa(int(p.Port))
		if _, ok := want[k]; ok && p.PID == os.Getpid() {
			want[k] = true
		}
	}
	for k, ok := range want {
		if !ok {
			t.Errorf("%s of pid %d missing from %+v", k, os.Getpid(), ports)
		}
	}
}

func portOf(a net.Addr) string { _, p, _ := net.SplitHostPort(a.String()); return p }

// FuzzParseNet: any /proc/net table parses without panicking.
func FuzzParseNet(f *testing.F) {
	f.Add("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0 100 0 0 10 0\n")
	f.Add("h\n 0: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 07 0 0 0 0 0 99\n")
	f.Fuzz(func(t *testing.T, s string) {
		for _, name := range []string{"tcp", "udp6"} {
			ports, err := parseNet(name, strings.NewReader(s))
			if err == nil {
				for _, p := range ports {
					if p.Address == "" {
						t.Fatalf("empty address in %+v", p)
					}
				}
			}
		}
	})
}

// FuzzParseStat: any /proc/PID/stat parses without panicking.
func FuzzParseStat(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 0 0 0 0 1 2 0 0 20 0 1 0 3 0 0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseStat(1, b)
		splitArgv(b)
		statusUID(b)
	})
}
