// Package bench holds tine's whole-system benchmarks. Each one runs tine
// and its peers side by side, in one run, on the same data, and reports
// ratios, because the machines it runs on are noisy.
package bench
