package main

import (
	"os"
	"path/filepath"
)

// userRoot is the built-in state root of the user running tine: /var/lib/tine
// for root, $XDG_DATA_HOME/tine (~/.local/share/tine) for anyone else,
// whose daemon runs rootless.
func userRoot() string {
	if os.Geteuid() == 0 {
		return builtinRoot
	}
	if d := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "tine")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "tine")
	}
	return builtinRoot
}
