package cowfs

import "github.com/hanwen/go-fuse/v2/fuse"

// rawFS is go-fuse's node file system with what cowfs must add at the
// level of the protocol, where go-fuse's node API cannot reach:
//
//   - the backing id of a passthrough open, chosen by node.Open and put
//     in the OPEN reply here (backing.go, ADR 0188);
//   - the clearing of set-ID bits a write asks for (ADR 0187). Mounts
//     negotiate FUSE_HANDLE_KILLPRIV_V2, so the kernel no longer refreshes
//     a file's attributes and asks whether it has capabilities before each
//     write, truncation and chown; it leaves clearing the set-user-ID and
//     set-group-ID bits to the server, flagging the requests of callers
//     without CAP_FSETID. Truncations and chowns reach Setattr with
//     FATTR_KILL_SUIDGID; a write carries WRITE_KILL_SUIDGID, which
//     go-fuse does not pass to the node, so it becomes a SETATTR with only
//     that flag, answered before the write. (OPEN's flag needs atomic
//     O_TRUNC, which cowfs does not negotiate: the kernel truncates with a
//     SETATTR.)
type rawFS struct {
	fuse.RawFileSystem
	bk *backings
}

func (r rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := r.RawFileSystem.Open(cancel, in, out)
	if bid, ok := r.bk.take(cancel); ok && st.Ok() {
		out.BackingID = bid
		out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
		out.OpenFlags &^= fuse.FOPEN_KEEP_CACHE
	}
	return st
}

func (r rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if st := r.kill(cancel, in); !st.Ok() {
		return 0, st
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if st := r.kill(cancel, in); !st.Ok() {
		return 0, st
	}
	return r.RawFileSystem.Writev(cancel, in, data)
}

// kill clears the bits a write by an unprivileged caller clears.
func (r rawFS) kill(cancel <-chan struct{}, in *fuse.WriteIn) fuse.Status {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID == 0 {
		return fuse.OK
	}
	sa := fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: in.InHeader, Valid: fuse.FATTR_KILL_SUIDGID}}
	var out fuse.AttrOut
	return r.RawFileSystem.SetAttr(cancel, &sa, &out)
}

// killSUIDGID is mode as a write, truncation or chown by an unprivileged
// caller leaves it: without set-user-ID, and without set-group-ID when
// the group may execute (otherwise the bit marks mandatory locking, and
// stays).
func killSUIDGID(mode uint32) uint32 {
	mode &^= 0o4000
	if mode&0o010 != 0 {
		mode &^= 0o2000
	}
	return mode
}
