package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// parseSize parses a byte count: a whole number with an optional suffix
// K, M, G or T (powers of 1024, either case, optionally followed by B or
// iB): 4096, 512M, 1G, 2GiB.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	up := strings.ToUpper(t)
	up = strings.TrimSuffix(strings.TrimSuffix(up, "IB"), "B")
	shift := 0
	if up != "" {
		switch up[len(up)-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift != 0 {
			up = up[:len(up)-1]
		}
	}
	n, err := strconv.ParseInt(up, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("bad size %q: want a byte count such as 4096, 512M or 1G", s)
	}
	return n << shift, nil
}
