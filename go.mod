module tine

go 1.26.8

require (
	github.com/alecthomas/kong v0.8.0 // indirect
	github.com/bobuhiro11/gokvm v0.0.8-0.20231003020000-f53faca69d28 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/hanwen/go-fuse/v2 v2.12.1 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	golang.org/x/arch v0.2.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
