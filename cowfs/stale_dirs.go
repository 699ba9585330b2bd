package cowfs

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// checkStateDir makes dir (mode 0700) if it is missing, and otherwise
// refuses a directory that another user could change: anyone who can
// write the state root can plant branches, records or cache files that a
// privileged tine would trust.
func checkStateDir(dir string) error {
	var st unix.Stat_t
	err := unix.Stat(dir, &st)
	if errors.Is(err, unix.ENOENT) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("cowfs: create state dir %s: %w", dir, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("cowfs: state dir %s: %w", dir, err)
	}
	return checkPrivateDir("state dir", dir, &st, 0o022)
}

// checkPrivateDir refuses dir unless it is a directory of this user with
// none of the permission bits in deny.
func checkPrivateDir(what, dir string, st *unix.Stat_t, deny uint32) error {
	switch euid := uint32(os.Geteuid()); {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("cowfs: %s %s is not a directory", what, dir)
	case st.Uid != euid:
		return fmt.Errorf("cowfs: %s %s is owned by uid %d, not by this user (uid %d): run chown %d %s, or use another directory",
			what, dir, st.Uid, euid, euid, dir)
	case st.Mode&deny != 0:
		return fmt.Errorf("cowfs: %s %s is open to other users (mode %#o): run chmod %o %s",
			what, dir, st.Mode&0o7777, st.Mode&0o7777&^deny, dir)
	}
	return nil
}
