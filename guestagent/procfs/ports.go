package procfs

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"tine/guestagent/proto"
)

// Socket states in /proc/net/{tcp,udp}: TCP_LISTEN, and TCP_CLOSE for an
// unconnected (bound) UDP socket.
const (
	stateListen = "0A"
	stateClose  = "07"
)

// Ports lists the listening TCP sockets and bound, unconnected UDP sockets
// of the agent's network namespace, with the pid of a process holding each.
func (p *FS) Ports() ([]proto.Port, error) {
	var ports []proto.Port
	for _, name := range []string{"tcp", "tcp6", "udp", "udp6"} {
		f, err := os.Open(filepath.Join(p.Root, "net", name))
		if os.IsNotExist(err) {
			continue // no IPv6 in this kernel
		}
		if err != nil {
			return nil, fmt.Errorf("list ports: %w", err)
		}
		got, err := parseNet(name, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("list ports: %s: %w", f.Name(), err)
		}
		ports = append(ports, got...)
	}
	if len(ports) == 0 {
		return ports, nil
	}
	owners := p.socketOwners()
	for i := range ports {
		ports[i].PID = owners[ports[i].Inode]
	}
	return ports, nil
}

// parseNet parses one /proc/net/{tcp,tcp6,udp,udp6} table.
func parseNet(name string, r io.Reader) ([]proto.Port, error) {
	want := stateListen
	if strings.HasPrefix(name, "udp") {
		want = stateClose
	}
	var ports []proto.Port
	sc := bufio.NewScanner(r)
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local rem st queues tr retrnsmt uid timeout inode ...
		if len(f) < 10 || f[3] != want {
			continue
		}
		if strings.HasPrefix(name, "udp") && !zeroRemote(f[2]) {
			continue
		}
		addr, port, err := parseAddr(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", sc.Text(), err)
		}
		inode, _ := strconv.ParseUint(f[9], 10, 64)
		ports = append(ports, proto.Port{Proto: name, Address: addr.String(), Port: port, Inode: inode})
	}
	return ports, sc.Err()
}

func zeroRemote(s string) bool {
	addr, port, err := parseAddr(s)
	return err == nil && port == 0 && addr.IsUnspecified()
}

// parseAddr parses "0100007F:1F90": the address as 32-bit words in host
// (little-endian) order, then the port in hex.
func parseAddr(s string) (netip.Addr, uint16, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.Addr{}, 0, fmt.Errorf("address %q has no port", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("address %q: port: %w", s, err)
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.Addr{}, 0, fmt.Errorf("address %q is not 4 or 16 hex bytes", s)
	}
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(raw[i:], binary.LittleEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return addr.Unmap(), uint16(port), nil
}

// socketOwners maps socket inodes to the lowest pid holding a descriptor
// for each.
func (p *FS) socketOwners() map[uint64]int {
	owners := map[uint64]int{}
	pids, err := p.PIDs()
	if err != nil {
		return owners
	}
	for _, pid := range pids {
		dir := filepath.Join(p.Root, strconv.Itoa(pid), "fd")
		d, err := os.Open(dir)
		if err != nil {
			continue // gone, or not ours to read
		}
		names, _ := d.Readdirnames(-1)
		d.Close()
		for _, n := range names {
			link, err := os.Readlink(filepath.Join(dir, n))
			if err != nil {
				continue
			}
			if rest, ok := strings.CutPrefix(link, "socket:["); ok {
				inode, err := strconv.ParseUint(strings.TrimSuffix(rest, "]"), 10, 64)
				if err == nil {
					if old, seen := owners[inode]; !seen || pid < old {
						owners[inode] = pid
					}
				}
			}
		}
	}
	return owners
}
