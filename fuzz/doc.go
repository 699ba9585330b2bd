// Package fuzz gathers tine's fuzz targets for decoders of untrusted input:
// pack and index files, refs, trees, diffs, virtqueue descriptors and agent
// messages. Each target has a seed corpus under testdata/fuzz.
package fuzz
