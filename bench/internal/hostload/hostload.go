// Package hostload reads the machine's load averages, which every
// benchmark records before and after its run.
package hostload

import (
	"os"
	"strings"
)

// Average returns the 1, 5 and 15 minute load averages, or "unknown".
func Average() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
