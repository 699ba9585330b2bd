// Command cowfs benchmarks tine's copy-on-write filesystem against its
// peers side by side, in one run, on the same data (see bench/fsbench
// and docs/bench/cowfs.md). It needs root.
//
//	go run ./bench/cowfs [--quick|--tiny] [--json|--csv] [--save FILE] [--dir DIR] [--only SECTIONS] [--tools TOOLS]
package main

import (
	"os"

	"tine/bench/fsbench"
)

func main() {
	os.Exit(fsbench.Main(os.Args[1:], os.Stdout, os.Stderr, fsbench.Options{}))
}
