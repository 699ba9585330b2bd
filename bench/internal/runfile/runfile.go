// Package runfile writes and reads a benchmark run's results as JSON
// (the --save files that bench/report reads).
package runfile

import (
	"encoding/json"
	"fmt"
	"os"
)

// Save writes v to path as indented JSON.
func Save(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Load reads path into v; what names the results in errors ("the
// sandbox results").
func Load(path, what string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", what, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s %s: %w", what, path, err)
	}
	return nil
}
