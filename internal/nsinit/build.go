package nsinit

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// buildRoot mounts the overlay of the host root, the sandbox's own /proc,
// /sys, /dev, /tmp and /run, the project and the agent's directory, covers
// the hidden paths and makes the result the root.
func buildRoot(c *Config) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	fd, err := mountOverlay(c)
	if err != nil {
		return err
	}
	r := Root{fd}
	steps := []func() error{
		func() error { return r.mount("proc", "proc", "proc", NoExec, "", false) },
		func() error { return r.mount("sysfs", "sys", "sysfs", NoExec|unix.MS_RDONLY, "", false) },
		func() error {
			return r.mount("tmpfs", "dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755", false)
		},
		func() error {
			return r.mount("tmpfs", "tmp", "tmpfs", nosuidNodev, tmpfsOptions("1777", c.TmpfsBytes), false)
		},
		func() error {
			return r.mount("tmpfs", "run", "tmpfs", nosuidNodev, tmpfsOptions("755", c.TmpfsBytes), false)
		},
	}
	for _, p := range []string{"sys", "sysrq-trigger", "irq", "bus", "fs"} {
		steps = append(steps, func() error { return r.readOnly("proc/"+p, false) })
	}
	for _, p := range []string{"kcore", "keys", "timer_list"} {
		steps = append(steps, func() error {
			if _, err := os.Stat("/proc/" + p); err != nil {
				return nil
			}
			return r.mount("/dev/null", "proc/"+p, "", unix.MS_BIND, "", true)
		})
	}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		steps = append(steps, func() error { return r.mount("/dev/"+d, "dev/"+d, "", unix.MS_BIND, "", true) })
	}
	steps = append(steps,
		func() error {
			return r.mount("devpts", "dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620", false)
		},
		func() error {
			return r.mount("tmpfs", "dev/shm", "tmpfs", NoExec, tmpfsOptions("1777", c.TmpfsBytes), false)
		},
		func() error { return r.devLinks() },
		func() error { return passDevices(r, c) },
		func() error {
			if c.Userns && c.runFD >= 0 {
				return r.Attach(c.runFD, strings.TrimPrefix(AgentDir, "/"), false)
			}
			return r.mount(c.RunDir, strings.TrimPrefix(AgentDir, "/"), "", unix.MS_BIND, "", false)
		},
		func() error {
			if !c.API {
				return nil
			}
			defer unix.Close(c.apiFD)
			return r.AttachAPI(c.apiFD)
		},
		// The agent binary, read-only, so that ps names it and no one in
		// the sandbox can write the host's copy.
		func() error {
			if c.Userns && c.agentFD >= 0 {
				return r.Attach(c.agentFD, strings.TrimPrefix(AgentBin, "/"), true)
			}
			return r.mount(c.Agent, strings.TrimPrefix(AgentBin, "/"), "", unix.MS_BIND, "", true)
		},
		func() error { return r.readOnly(strings.TrimPrefix(AgentBin, "/"), true) },
	)
	if !c.Warm {
		steps = append(steps, func() error {
			if c.Userns {
				return r.Attach(c.projectFD, c.ProjectPath, false)
			}
			return r.mount(c.ProjectSource, c.ProjectPath, "", unix.MS_BIND, "", false)
		})
		for _, h := range c.Hide {
			steps = append(steps, func() error { return r.Hide(h) })
		}
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return PivotTo(fd, c.Root)
}

// mountOverlay mounts the sandbox's overlay root and returns a descriptor
// of it: in a user namespace it attaches the one the host made (see
// package ns: idMap.overlay) on its mount point.
func mountOverlay(c *Config) (int, error) {
	if !c.Userns && Rootless() && c.Image == "" {
		return mountRootless(c) // rootless.go
	}
	if c.Userns {
		if c.mountFD < 0 {
			// The state directory is out of this process's reach: a
			// mount point on a small tmpfs over /tmp, which goes with the
			// host root at the pivot.
			if err := unix.Mount("tmpfs", "/tmp", "tmpfs", NoExec, "mode=700,size=4k"); err != nil {
				return -1, fmt.Errorf("mount point for the root: %w", err)
			}
			if err := unix.Mkdir("/tmp/root", 0o700); err != nil {
				return -1, fmt.Errorf("mount point for the root: %w", err)
			}
			fd, err := unix.Open("/tmp/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return -1, fmt.Errorf("mount point for the root: %w", err)
			}
			c.mountFD = fd
		}
		err := unix.MoveMount(c.overlayFD, "", c.mountFD, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(c.mountFD)
		if err != nil {
			return -1, fmt.Errorf("attach the root overlay: %w", err)
		}
		return c.overlayFD, nil
	}
	lower := "/"
	if c.Image != "" {
		lower = c.Image
	}
	lower, sfd, err := StackedLower(c.Lower, c.LowerBase, lower, nil)
	if err != nil {
		return -1, err
	}
	if sfd >= 0 {
		defer unix.Close(sfd)
	}
	opts := "lowerdir=" + lower + ",upperdir=" + c.Upper + ",workdir=" + c.Work
	if Rootless() {
		opts = "userxattr," + opts // rootless mode: the layer's attributes are user.*
	}
	if err := unix.Mount("overlay", c.Root, "overlay", 0, opts); err != nil {
		return -1, fmt.Errorf("mount the root overlay at %s (%s): %w", c.Root, opts, err)
	}
	fd, err := unix.Open(c.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", c.Root, err)
	}
	return fd, nil
}

// passDevices binds the devices and read-only files of c.
func passDevices(r Root, c *Config) error {
	for _, d := range c.Devices {
		if err := r.mount(d, strings.TrimPrefix(d, "/"), "", unix.MS_BIND, "", true); err != nil {
			return err
		}
	}
	for _, f := range c.ReadOnly {
		if err := r.readOnly(strings.TrimPrefix(f, "/"), true); err != nil {
			return err
		}
	}
	return nil
}

// tmpfsOptions bounds a sandbox memory file system of mode: its size,
// and its inodes (one per 4 KiB of size), so that neither files nor empty
// names exhaust the host's memory.
func tmpfsOptions(mode string, size int64) string {
	return fmt.Sprintf("mode=%s,size=%d,nr_inodes=%d", mode, size, max(size/4096, 1024))
}

// takeAPIFD takes the api socket's mount, the last of fds, when the
// config says one came.
func (c *Config) takeAPIFD(fds []int) ([]int, error) {
	c.apiFD = -1
	if !c.API {
		return fds, nil
	}
	if len(fds) == 0 {
		return fds, errors.New("the api socket's mount did not come with the config")
	}
	c.apiFD = fds[len(fds)-1]
	return fds[:len(fds)-1], nil
}

// takeFDs takes what the host passes the init step of a sandbox in a
// user namespace (package ns: initFDs): the overlay, the agent's
// directory, the agent binary and, unless the sandbox is a warm one, the
// project, all detached mounts.
func (c *Config) takeFDs(fds []int) error {
	want := 4
	if c.Warm {
		want = 3
	}
	if len(fds) != want {
		CloseAll(fds)
		return fmt.Errorf("want %d descriptors with the config, got %d", want, len(fds))
	}
	c.overlayFD, c.mountFD = fds[0], -1
	c.runFD, c.agentFD = fds[1], fds[2]
	c.projectFD = -1
	if !c.Warm {
		c.projectFD = fds[3]
	}
	return nil
}

// CloseAll closes fds.
func CloseAll(fds []int) {
	for _, f := range fds {
		unix.Close(f)
	}
}
