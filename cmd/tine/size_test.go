package main

import "testing"

func TestParseSizeSuffixes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "1K": 1 << 10, "512M": 512 << 20, "512m": 512 << 20,
		"1G": 1 << 30, "2GiB": 2 << 30, "3GB": 3 << 30, "1T": 1 << 40, "7b": 7,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "G", "-1G", "1.5G", "1X", "9999999999T", "0x10"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}
