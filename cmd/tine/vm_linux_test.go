package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseMemSize: guest RAM sizes go through the one size parser and
// must not be zero.
func TestParseMemSize(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		bad  bool
	}{
		{"512M", 512 << 20, false},
		{"3G", 3 << 30, false},
		{"64k", 64 << 10, false},
		{"4096", 4096, false},
		{"", 0, true},
		{"0M", 0, true},
		{"-1G", 0, true},
		{"12X", 0, true},
		{"99999999999G", 0, true},
	}
	for _, tc := range tests {
		got, err := parseMemSize(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("parseMemSize(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestVMBootErrors(t *testing.T) {
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, []byte("not a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		errHas string
	}{
		{"no kernel", []string{"vm", "boot"}, 2, "--kernel FILE"},
		{"bad mem", []string{"vm", "boot", "--kernel", junk, "--mem", "lots"}, 2, `bad size "lots"`},
		{"missing kernel", []string{"vm", "boot", "--kernel", junk + ".none"}, 1, "read kernel"},
		{"not a kernel", []string{"vm", "boot", "--kernel", junk, "--mem", "16M"}, 1, "bad kernel image"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "not a kernel" {
				if _, err := os.Stat("/dev/kvm"); err != nil {
					t.Skip("/dev/kvm is missing")
				}
			}
			var out, errOut bytes.Buffer
			if code := run(tc.args, &out, &errOut); code != tc.code || !strings.Contains(errOut.String(), tc.errHas) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, errOut.String(), tc.code, tc.errHas)
			}
		})
	}
}
