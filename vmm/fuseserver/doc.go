// Package fuseserver is a passthrough FUSE file system, speaking go-fuse's raw
// protocol API (fuse.RawFileSystem), whose tables can move to another process.
//
// A Server names every file the kernel knows by its path from the root: a node
// id stands for a parent node and a name, and a file handle for a node, its
// open flags and an fd. Export writes those tables out and Import loads them
// into a new Server over a copy of the same tree, so a guest kernel whose
// memory was forked keeps using its node ids and open file handles against the
// copy: handles are reopened by path at first use.
//
// What it promises:
//   - No path escapes the root: every operation is relative to a directory fd
//     opened in New, names from the kernel are single validated components,
//     parents are opened with openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, and
//     a symlink is never followed at the last component.
//   - Node ids and handle ids survive Export/Import, and ids are never reused.
//
// What it does not:
//   - A file deleted before the export but still open in the exporting server
//     has no path, so its handle answers EIO in the importing server.
//   - A directory handle is relisted after Import; a listing interrupted by
//     the export continues at the same index of the copy's order.
//   - Access checks are the guest kernel's. The server runs as root in a
//     nodev,nosuid chroot; ACCESS answers from mode bits and the caller's
//     uid and primary gid only.
//   - FIFOs, sockets and device nodes are never opened for I/O: OPEN of
//     anything but a regular file answers EPERM (OPENDIR: ENOTDIR), and MKNOD
//     of a device node answers EPERM.
//   - Outside a chroot the extended attribute calls use the root-joined path
//     after checking its parent; a concurrent rename on the host can race them.
package fuseserver
