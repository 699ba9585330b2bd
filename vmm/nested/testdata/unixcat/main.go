// Command unixcat connects to the Unix socket its argument names, sends
// its standard input there and writes what comes back to its standard
// output until the peer closes: nc -U for a guest whose busybox has no
// Unix sockets.
package main

import (
	"fmt"
	"io"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: unixcat SOCKET")
		os.Exit(2)
	}
	c, err := net.Dial("unix", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "unixcat:", err)
		os.Exit(1)
	}
	go io.Copy(c, os.Stdin)
	if _, err := io.Copy(os.Stdout, c); err != nil {
		fmt.Fprintln(os.Stderr, "unixcat:", err)
		os.Exit(1)
	}
}
