// Package chunkstore is tine's content-addressed, deduplicating store.
//
// Data is cut into chunks (content-defined for files, fixed-size for block
// and memory images), each named by the SHA-256 of its bytes, compressed
// with zstd when that helps, and appended to pack files. An index maps chunk
// ids to their place in a pack; named refs keep roots alive. Everything
// above it in tine (snapshots, forks, diffs, VM memory images) is made of
// chunks in one store. The on-disk format is described in docs/chunkstore.md.
package chunkstore
