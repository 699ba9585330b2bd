package main

import (
	"math"
	"strconv"
	"strings"

	"tine/api"
	"tine/sandbox"
)

// insideFlags are tine serve's policy for what sandboxes may ask for
// themselves (api.InsideOptions): --inside-grant and --inside-max.
type insideFlags struct {
	grant, max string
}

// options parses the flags into the inside API's policy; a bad value is a
// usage error naming the flag and the field.
func (f insideFlags) options() (api.InsideOptions, error) {
	var o api.InsideOptions
	var err error
	if o.Grant, err = parseInsideLimits("inside-grant", f.grant); err != nil {
		return o, err
	}
	if o.MaxLimits, err = parseInsideLimits("inside-max", f.max); err != nil {
		return o, err
	}
	if err := o.Check(); err != nil {
		return o, usageErr("--inside-grant: %v", err)
	}
	return o, nil
}

// parseInsideLimits parses a list such as memory=1G,cpus=1,pids=512,disk=20G
// (sizes as parseSize reads them) given to flag.
func parseInsideLimits(flag, s string) (sandbox.Limits, error) {
	var l sandbox.Limits
	if strings.TrimSpace(s) == "" {
		return l, nil
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return l, usageErr("--%s %q: want FIELD=VALUE[,FIELD=VALUE...] with FIELD memory, cpus, pids or disk, such as memory=4G,cpus=2", flag, kv)
		}
		if seen[k] {
			return l, usageErr("--%s: field %s given twice", flag, k)
		}
		seen[k] = true
		switch k {
		case "memory", "disk":
			n, err := parseSize(v)
			if err != nil {
				return l, usageErr("--%s %s: %v", flag, k, err)
			}
			if k == "memory" {
				l.MemoryBytes = n
			} else {
				l.ProjectBytes = n
			}
		case "pids":
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 0 {
				return l, usageErr("--%s pids=%q: want a whole number, 0 or more", flag, v)
			}
			l.Pids = n
		case "cpus":
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || math.IsNaN(n) || n < 0 || n > 4096 {
				return l, usageErr("--%s cpus=%q: want a number of CPUs from 0 to 4096, such as 0.5 or 2", flag, v)
			}
			l.CPUs = n
		default:
			return l, usageErr("--%s: unknown field %q; want memory, cpus, pids or disk", flag, k)
		}
	}
	if err := l.Check(); err != nil {
		return l, usageErr("--%s: %v", flag, err)
	}
	return l, nil
}

// insideHelp is the flags' help text.
var insideHelp = [2]string{
	"what a sandbox gets at once when it asks for more from inside (POST /v1/self/resources), such as memory=1G,cpus=1,pids=512 (at most --inside-max)",
	"the most a sandbox may ask for from inside, a person approving past --inside-grant, such as memory=4G,cpus=2,pids=4096,disk=20G (default: none, every ask refused)",
}
