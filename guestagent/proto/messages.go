package proto

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"strings"
	"time"
)

// Hello is the first frame of each side.
type Hello struct {
	Magic   string `json:"magic"`
	Version int    `json:"version"`
}

// Error ends a stream that failed, or the connection (id 0).
type Error struct {
	Message string `json:"message"`
	// Code, when set, says what kind of failure it is, for a caller to act
	// on: CodeNotFound, CodeNotExecutable or CodeBadDir for an exec whose
	// command did not start. Agents before it send none; a client treats
	// a code it does not know as none.
	Code string `json:"code,omitempty"`
}

// Codes of an exec's Error (Error.Code).
const (
	// CodeNotFound: the command is not in PATH, its path names nothing,
	// or its interpreter (#! line or ELF loader) is missing.
	CodeNotFound = "not_found"
	// CodeNotExecutable: the command was found but cannot be executed
	// (no permission, a directory, not an executable format).
	CodeNotExecutable = "not_executable"
	// CodeBadDir: the working directory does not exist or is not a
	// directory.
	CodeBadDir = "bad_dir"
)

// ExecExitStatus is the exit status a shell gives a command that failed
// to start with code: 127 for CodeNotFound, 126 for CodeNotExecutable and
// CodeBadDir, and 0 for any other code (not a failure to start).
func ExecExitStatus(code string) int {
	switch code {
	case CodeNotFound:
		return 127
	case CodeNotExecutable, CodeBadDir:
		return 126
	}
	return 0
}

// ExecRequest asks the agent to run a command.
type ExecRequest struct {
	Argv []string `json:"argv"`
	// Env is the environment of the process (KEY=value); the agent adds
	// PATH and HOME where it sets none, and TERM on a TTY.
	Env []string `json:"env,omitempty"`
	// Dir is the working directory; empty means "/".
	Dir string  `json:"dir,omitempty"`
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	// TTY runs the process on a new pseudo-terminal of Rows x Cols; its
	// output then arrives as one stdout stream.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Timeout, when positive, kills the process group after that long.
	Timeout time.Duration `json:"timeout,omitempty"`
}

// Started says the exec's process runs.
type Started struct {
	PID int `json:"pid"`
}

// Exit is how an exec's process ended.
type Exit struct {
	PID int `json:"pid"`
	// Code is the exit status, or -1 when the process was killed by a signal.
	Code int `json:"code"`
	// Signal is the signal that killed the process, or 0.
	Signal   int  `json:"signal,omitempty"`
	TimedOut bool `json:"timed_out,omitempty"`
	// KilledBy says what outside the command killed it, one of the
	// Killed* values; empty when nothing was seen to (the command ended
	// by itself, a signal it or a person sent, or --timeout). The daemon
	// sets it, not the guest agent; see docs/api.md.
	KilledBy string `json:"killed_by,omitempty"`
	// KilledReason words KilledBy for a person, such as "out of memory
	// (memory limit 64 MiB)".
	KilledReason string `json:"killed_reason,omitempty"`
}

// Exit.KilledBy values.
const (
	// KilledOOM: the kernel's OOM killer killed the command (or, for an
	// exit status of 137, a process it waited for) while it ran: the
	// sandbox was over its memory limit, or the host out of memory.
	KilledOOM = "oom"
	// KilledStopped: the sandbox was stopped while the command ran (tine
	// stop, a rollback, the daemon's shutdown).
	KilledStopped = "stopped"
	// KilledRemoved: the sandbox was removed while the command ran.
	KilledRemoved = "removed"
	// KilledLifetime: the sandbox reached its lifetime limit and was
	// removed while the command ran.
	KilledLifetime = "lifetime"
)

// Signal asks the agent to send a signal to an exec's process (or its whole
// process group).
type Signal struct {
	Signal int  `json:"signal"`
	Group  bool `json:"group,omitempty"`
}

// Resize changes the window size of an exec's terminal.
type Resize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// PutRequest starts writing a file; Data frames and an End frame follow.
type PutRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
}

// ModeBits turns a FileMode into the 07777 bits of a Unix mode, the form
// PutRequest and FileInfo carry.
func ModeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// GetRequest asks for a regular file's content.
type GetRequest struct {
	Path string `json:"path"`
}

// PutTreeRequest starts copying a file or directory tree into the
// sandbox as a tar stream whose entries all lie under one top entry
// (internal/treecopy). Path is the destination: an existing directory
// receives the top entry under its own name; any other path names the
// copy itself, and its parent must exist. Into says the destination must
// be an existing directory (the user wrote it with a trailing slash).
type PutTreeRequest struct {
	Path string `json:"path"`
	Into bool   `json:"into,omitempty"`
}

// PutTreeResult is the JSON payload of a put-tree's End: where the copy
// landed.
type PutTreeResult struct {
	Path string `json:"path"`
}

// GetTreeRequest asks for the file, symlink or directory tree at Path as
// a tar stream whose top entry is Path's last element.
type GetTreeRequest struct {
	Path string `json:"path"`
}

// FileInfo describes the file a Get streams.
type FileInfo struct {
	Mode uint32 `json:"mode"`
	Size int64  `json:"size"`
}

// Process is one process as the agent's /proc shows it.
type Process struct {
	PID  int    `json:"pid"`
	PPID int    `json:"ppid"`
	UID  uint32 `json:"uid"`
	// User is the name of UID, when /etc/passwd has it.
	User string `json:"user,omitempty"`
	// Argv is the command line, cut to MaxArgvBytes (ArgvTruncated then
	// says so); for kernel threads it is empty and Comm names the thread.
	Argv          []string `json:"argv"`
	ArgvTruncated bool     `json:"argv_truncated,omitempty"`
	Comm          string   `json:"comm"`
	// State is the one-letter state of /proc/PID/stat (R, S, D, Z, T...).
	State   string        `json:"state"`
	CPUTime time.Duration `json:"cpu_time"`
	RSS     uint64        `json:"rss"`
	Start   time.Time     `json:"start"`
}

// MaxArgvBytes bounds the command line the agent reports for one process.
const MaxArgvBytes = 4096

// Port is one listening socket.
type Port struct {
	// Proto is tcp, tcp6, udp or udp6.
	Proto   string `json:"proto"`
	Address string `json:"address"`
	Port    uint16 `json:"port"`
	// PID owns the socket, or is 0 when no process the agent can see holds it.
	PID   int    `json:"pid,omitempty"`
	Inode uint64 `json:"inode"`
}

// Event types.
const (
	EventProcessStarted = "process-started"
	EventProcessExited  = "process-exited"
	EventPortOpened     = "port-opened"
	EventPortClosed     = "port-closed"
	// EventLost says Lost events were dropped because the host read too slowly.
	EventLost = "lost"
)

// Event is one change the agent saw.
type Event struct {
	Type string    `json:"type"`
	Time time.Time `json:"time"`
	// Process is set for process events; for an exit the agent did not see
	// start, only PID is known.
	Process *Process `json:"process,omitempty"`
	// Exit is set for process-exited when the agent reaped the process.
	Exit *Exit `json:"exit,omitempty"`
	Port *Port `json:"port,omitempty"`
	Lost int   `json:"lost,omitempty"`
}

// JSONFrame encodes v as the payload of a frame.
func JSONFrame(k Kind, id uint32, v any) (Frame, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Frame{}, fmt.Errorf("encode %v frame %d: %w", k, id, err)
	}
	if len(b) > MaxPayload {
		return Frame{}, fmt.Errorf("encode %v frame %d (%d bytes): %w", k, id, len(b), ErrFrameTooLarge)
	}
	return Frame{Kind: k, ID: id, Payload: b}, nil
}

// Decode decodes f's JSON payload into v, naming the frame in its error.
func Decode(f Frame, v any) error {
	if err := json.Unmarshal(f.Payload, v); err != nil {
		return fmt.Errorf("decode %v frame %d: %w", f.Kind, f.ID, err)
	}
	return nil
}

// CheckHello checks a peer's Hello frame: it must be a Hello of this
// protocol at Version.
func CheckHello(f Frame) error {
	if f.Kind == KindError {
		var e Error
		if Decode(f, &e) == nil {
			return fmt.Errorf("guest agent refused the handshake: %s", e.Message)
		}
	}
	if f.Kind != KindHello {
		return fmt.Errorf("handshake: got a %v frame, want hello; the peer is not a guest agent endpoint", f.Kind)
	}
	var h Hello
	if err := Decode(f, &h); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if h.Magic != Magic {
		return fmt.Errorf("handshake: magic %q, want %q; the peer speaks another protocol", h.Magic, Magic)
	}
	if h.Version != Version {
		return fmt.Errorf("handshake: peer speaks protocol version %d, this side speaks %d; upgrade the older side", h.Version, Version)
	}
	return nil
}

// HelloFrame is this side's handshake frame.
func HelloFrame() Frame {
	f, _ := JSONFrame(KindHello, 0, Hello{Magic: Magic, Version: Version})
	return f
}

// MaxHygieneEntropy bounds HygieneRequest.Entropy.
const MaxHygieneEntropy = 4096

// HygieneRequest is what a VM clone is told after a fork or a restore,
// before it runs user work (docs/fork-hygiene.md): host entropy for the
// kernel RNG, the host's wall clock, and the clone's generation.
type HygieneRequest struct {
	// Entropy is mixed into the kernel pool and credited (at most
	// MaxHygieneEntropy bytes).
	Entropy []byte `json:"entropy,omitempty"`
	// Now is the host's wall clock when the request was sent; zero
	// leaves the clock alone.
	Now time.Time `json:"now,omitzero"`
	// Generation is the clone's generation counter, published at
	// /run/tine/generation.
	Generation uint64 `json:"generation"`
	// Net is the clone's network identity; nil leaves the network alone
	// (a machine without a network device).
	Net *HygieneNet `json:"net,omitempty"`
	// Share, when given, is the project share to (re)mount before user
	// work (docs/sandboxes.md).
	Share *ShareMount `json:"share,omitempty"`
}

// HygieneNet is a VM's network identity: the agent brings Interface down,
// gives it MAC, makes Address its only IPv4 address, brings it up and
// routes by default through Gateway.
type HygieneNet struct {
	// Interface is the guest's interface name, e.g. "eth0".
	Interface string `json:"interface"`
	// MAC is a unicast Ethernet address, "02:xx:xx:xx:xx:xx".
	MAC string `json:"mac"`
	// Address is the guest's IPv4 address and prefix, "10.214.0.2/30".
	Address string `json:"address"`
	// Gateway is the host end's IPv4 address, inside Address's network.
	Gateway string `json:"gateway"`
}

// maxHygieneField bounds each string of HygieneNet.
const maxHygieneField = 64

// Parse checks the identity and returns its parts.
func (n HygieneNet) Parse() (iface string, mac net.HardwareAddr, addr netip.Prefix, gw netip.Addr, err error) {
	for _, f := range []string{n.Interface, n.MAC, n.Address, n.Gateway} {
		if len(f) > maxHygieneField {
			return "", nil, addr, gw, fmt.Errorf("hygiene network field of %d bytes, at most %d", len(f), maxHygieneField)
		}
	}
	if n.Interface == "" || len(n.Interface) >= 16 || strings.ContainsAny(n.Interface, "/ \x00:") || n.Interface == "." || n.Interface == ".." {
		return "", nil, addr, gw, fmt.Errorf("hygiene network interface %q is not an interface name", n.Interface)
	}
	if mac, err = net.ParseMAC(n.MAC); err != nil || len(mac) != 6 || mac[0]&1 != 0 {
		return "", nil, addr, gw, fmt.Errorf("hygiene network MAC %q is not a unicast Ethernet address", n.MAC)
	}
	if addr, err = netip.ParsePrefix(n.Address); err != nil || !addr.Addr().Is4() || addr.Bits() < 8 || addr.Bits() > 30 || addr.Masked().Addr() == addr.Addr() {
		return "", nil, addr, gw, fmt.Errorf("hygiene network address %q is not an IPv4 host address with a prefix of 8 to 30 bits", n.Address)
	}
	if gw, err = netip.ParseAddr(n.Gateway); err != nil || !gw.Is4() || !addr.Masked().Contains(gw) || gw == addr.Addr() {
		return "", nil, addr, gw, fmt.Errorf("hygiene network gateway %q is not another address of %s", n.Gateway, addr.Masked())
	}
	return n.Interface, mac, addr, gw, nil
}

// Check refuses a request the agent must not apply.
func (h HygieneRequest) Check() error {
	if len(h.Entropy) > MaxHygieneEntropy {
		return fmt.Errorf("hygiene request with %d bytes of entropy, at most %d", len(h.Entropy), MaxHygieneEntropy)
	}
	if h.Net != nil {
		if _, _, _, _, err := h.Net.Parse(); err != nil {
			return err
		}
	}
	if err := h.Share.Check(); err != nil {
		return err
	}
	return nil
}
