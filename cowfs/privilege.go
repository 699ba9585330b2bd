package cowfs

import "fmt"

// HostPrivileges says which kinds of privilege a promotion or an export
// may carry from a snapshot to the host. The zero value carries none: no
// setuid or setgid bit, no device node, and no owner the sandbox chose
// (what is written belongs to whoever runs the promotion or export).
// Each field is an explicit opt-in named for what it allows.
type HostPrivileges struct {
	SetID   bool // keep setuid and setgid bits
	Devices bool // create character and block device nodes
	Owners  bool // keep the uid and gid recorded in the snapshot
}

// Refusal is one change that a promotion or export did not carry to the
// host, with the reason and, where there is one, the flag that allows it.
type Refusal struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// refuse says why e may not be carried to the host at all under p, or ""
// when it may. Setuid and setgid bits are not a reason to leave an entry
// out: hostMode strips them, and the caller reports the stripping.
func (p HostPrivileges) refuse(e *Entry) string {
	switch e.Type {
	case TypeChar, TypeBlock:
		if !p.Devices {
			return fmt.Sprintf("%s device %d:%d is not created on the host (allow with --allow-devices)", e.Type, e.Rdev>>8&0xfff, e.Rdev&0xff|e.Rdev>>12&0xfff00)
		}
	case TypeSocket:
		return "sockets cannot be carried to the host"
	}
	return ""
}

// hostMode is the permission bits e gets on the host under p: setuid and
// setgid are cleared unless p.SetID, and umask is applied.
func (p HostPrivileges) hostMode(e *Entry, umask uint32) uint32 {
	m := e.Mode & 0o7777
	if !p.SetID {
		m &^= 0o6000
	}
	return m &^ umask
}
