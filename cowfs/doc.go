// Package cowfs is tine's copy-on-write filesystem: immutable Merkle trees
// of directories and files over chunkstore, writable branches over them, and
// a FUSE mount of a branch. A snapshot is a root id, so taking one and
// forking from one are O(1); a diff skips equal subtrees by id.
package cowfs
