module tine

go 1.26.8

require (
	github.com/bobuhiro11/gokvm v0.0.8-0.20231003020000-f53faca69d28
	github.com/coder/websocket v1.8.15
	github.com/google/go-cmp v0.7.0
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/klauspost/compress v1.20.3
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.49.0
	golang.org/x/term v0.47.0
)

require github.com/inconshreveable/mousetrap v1.1.0 // indirect
