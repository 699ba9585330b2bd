package virtio

import (
	"errors"
	"fmt"
)

// The virtio-fs device's own state in a fork or a saved image
// (StatefulDevice): the guest's FUSE_INIT and its server's tables, so
// that a clone's server answers the node ids and file handles the clone's
// guest kernel holds (docs/fork-hygiene.md).
//
//	"TINEFSD1" | u32 n, n bytes of FUSE_INIT (at most maxFSInit)
//	| u32 n, n bytes of server tables (the rest of MaxDeviceState)
//
// Little-endian; the decoder checks every length against what is left.
const (
	fsStateMagic = "TINEFSD1"
	// maxFSInit bounds the FUSE_INIT a device keeps (Linux sends 104
	// bytes; a longer one, from a hostile guest, is not kept, and its
	// clones mount the share again).
	maxFSInit = 4096
)

var _ StatefulDevice = (*FS)(nil)

// SaveState implements StatefulDevice. A device with no session, with a
// request its server has not answered (a lock wait, say: the clone's
// guest would wait for that answer forever), or whose server does not
// export, has no state: its clones start without a session, and their
// guest agent mounts the share again (which a process using it from
// before the fork prevents).
func (f *FS) SaveState() ([]byte, error) {
	s := f.sess
	if s == nil || s.init == nil || len(s.pending) > 0 {
		return nil, nil
	}
	tables, err := s.c.Export()
	if err != nil || len(tables) > MaxDeviceState-len(fsStateMagic)-8-len(s.init) {
		return nil, nil
	}
	return encodeFSState(s.init, tables), nil
}

// RestoreState implements StatefulDevice: it starts a server of the
// clone's tree that takes over the parent's tables, and replays the
// guest's FUSE_INIT to it (the answer is dropped: the guest's kernel has
// the parent's). The clone's guest then goes on with the node ids and
// handles it has.
func (f *FS) RestoreState(t *Transport, state []byte) error {
	init, tables, err := decodeFSState(state)
	if err != nil {
		return err
	}
	if f.Connect == nil {
		return errors.New("virtio-fs: the clone's device has no server for the parent's share")
	}
	conn, err := f.Connect(tables)
	if err != nil {
		return fmt.Errorf("virtio-fs: start the clone's server: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	f.endSession()
	f.startSession(t, conn)
	s := f.sess
	s.init = init
	s.next++
	msg := append([]byte(nil), init...)
	le.PutUint64(msg[8:], s.next)
	s.pending[s.next] = fsPending{drop: true}
	f.send(s, msg)
	return nil
}

func encodeFSState(init, tables []byte) []byte {
	b := make([]byte, 0, len(fsStateMagic)+8+len(init)+len(tables))
	b = append(b, fsStateMagic...)
	b = le.AppendUint32(b, uint32(len(init)))
	b = append(b, init...)
	b = le.AppendUint32(b, uint32(len(tables)))
	return append(b, tables...)
}

// decodeFSState parses what encodeFSState wrote. The INIT must be a
// FUSE_INIT request whose header's length is its own; the tables are the
// server's to check.
func decodeFSState(b []byte) (init, tables []byte, err error) {
	bad := func(format string, a ...any) ([]byte, []byte, error) {
		return nil, nil, fmt.Errorf("%w: virtio-fs state: %s", ErrBadGuest, fmt.Sprintf(format, a...))
	}
	if len(b) < len(fsStateMagic) || string(b[:len(fsStateMagic)]) != fsStateMagic {
		return bad("no %s header", fsStateMagic)
	}
	b = b[len(fsStateMagic):]
	field := func(what string, max int) ([]byte, error) {
		if len(b) < 4 {
			return nil, fmt.Errorf("%s: cut short", what)
		}
		n := le.Uint32(b)
		if uint64(n) > uint64(len(b)-4) || uint64(n) > uint64(max) {
			return nil, fmt.Errorf("%s: %d bytes, %d left, at most %d", what, n, len(b)-4, max)
		}
		v := b[4 : 4+n]
		b = b[4+n:]
		return v, nil
	}
	if init, err = field("FUSE_INIT", maxFSInit); err != nil {
		return bad("%v", err)
	}
	if len(init) < fuseInHeaderSize || le.Uint32(init) != uint32(len(init)) || le.Uint32(init[4:]) != fuseInit {
		return bad("FUSE_INIT of %d bytes is not one", len(init))
	}
	if tables, err = field("tables", MaxDeviceState); err != nil {
		return bad("%v", err)
	}
	if len(b) != 0 {
		return bad("%d bytes after the tables", len(b))
	}
	return init, tables, nil
}
