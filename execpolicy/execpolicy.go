// Package execpolicy decides whether a command may run in a sandbox:
// allow, ask (wait for a person) or deny, by glob patterns over the
// command line, as agent harnesses write them:
//
//	{"npm *": "allow", "rm -rf *": "deny", "*": "ask"}
//
// It is a guard-rail at the API, not a security boundary: a command can
// be spelled many ways, and whatever runs is still confined by the
// sandbox (docs/policy.md).
package execpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
)

// Action is what a rule says about the commands it matches.
type Action string

// The actions, from the most permissive.
const (
	Allow Action = "allow"
	Ask   Action = "ask"
	Deny  Action = "deny"
)

func (a Action) rank() int {
	switch a {
	case Allow:
		return 0
	case Ask:
		return 1
	}
	return 2
}

// Limits on a policy, which comes through the API.
const (
	MaxRules   = 1024
	MaxPattern = 4096
	// MaxCommand is the longest command line matched whole; a longer one
	// is asked about (or denied, when no rule allows asking).
	MaxCommand = 64 << 10
)

// Rule is one pattern and its action. In a pattern, * matches any run of
// characters (spaces and slashes too) and ? any one; all else is literal.
// A pattern ending in " *" also matches the command without arguments.
type Rule struct {
	Pattern string `json:"pattern"`
	Action  Action `json:"action"`
}

// Policy is a sandbox's rules. Of the rules matching a command, the most
// specific wins: the one with the most literal characters; between equally
// specific rules, deny over ask over allow. With no rule matching, the
// command is allowed (an empty policy allows everything; add "*" to
// change that).
type Policy struct {
	Rules []Rule `json:"rules"`
	// FreezeOnAsk freezes the sandbox while a command waits for a person.
	FreezeOnAsk bool `json:"freeze_on_ask,omitempty"`
}

// Check reports a rule out of bounds or with an unknown action.
func (p *Policy) Check() error {
	if len(p.Rules) > MaxRules {
		return fmt.Errorf("exec policy: %d rules, more than %d", len(p.Rules), MaxRules)
	}
	seen := map[string]bool{}
	for _, r := range p.Rules {
		if r.Pattern == "" || len(r.Pattern) > MaxPattern {
			return fmt.Errorf("exec policy: pattern %.40q: want 1 to %d bytes", r.Pattern, MaxPattern)
		}
		if r.Action.rank() == 2 && r.Action != Deny {
			return fmt.Errorf("exec policy: pattern %q: action %q: want allow, ask or deny", r.Pattern, r.Action)
		}
		if seen[r.Pattern] {
			return fmt.Errorf("exec policy: pattern %q given twice", r.Pattern)
		}
		seen[r.Pattern] = true
	}
	return nil
}

// ParseMap reads a policy in the harnesses' form, one JSON object of
// pattern to action, in its order.
func ParseMap(b []byte) (*Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, errors.New(`exec policy: want a JSON object such as {"npm *": "allow", "*": "ask"}`)
	}
	p := &Policy{Rules: []Rule{}}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("exec policy: %w", err)
		}
		var v string
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("exec policy: pattern %q: want \"allow\", \"ask\" or \"deny\": %w", k, err)
		}
		p.Rules = append(p.Rules, Rule{Pattern: k.(string), Action: Action(v)})
		if len(p.Rules) > MaxRules {
			break
		}
	}
	if err := p.Check(); err != nil {
		return nil, err
	}
	return p, nil
}

// Decision is what the policy says about one command.
type Decision struct {
	Action Action `json:"action"`
	// Rule is the pattern that decided ("" when none matched).
	Rule string `json:"rule,omitempty"`
	// Command is the command line the rule matched: argv joined by
	// spaces, or one command of a shell script given with sh -c.
	Command string `json:"command"`
}

// shells are the programs whose -c script is looked into.
var shells = map[string]bool{"sh": true, "bash": true, "dash": true, "zsh": true, "ash": true}

// Decide says what the policy does with argv. The command line is argv
// joined by spaces; for "sh -c SCRIPT" (and bash, dash, zsh, ash) each
// command of the script, split at ; & | ( ) ` and newlines, is decided
// instead, and the strictest answer of them is taken. This is a best effort: see the
// package comment.
func (p *Policy) Decide(argv []string) Decision {
	if len(argv) >= 3 && shells[path.Base(argv[0])] && strings.HasPrefix(argv[1], "-") && strings.Contains(argv[1], "c") {
		if parts := splitScript(argv[2]); len(parts) > 0 {
			var d Decision
			for i, part := range parts {
				if e := p.decide(part); i == 0 || e.Action.rank() > d.Action.rank() {
					d = e
				}
			}
			return d
		}
	}
	return p.decide(strings.Join(argv, " "))
}

// splitScript splits a shell script at its command separators.
func splitScript(s string) []string {
	f := strings.FieldsFunc(s, func(r rune) bool {
		return r == ';' || r == '&' || r == '|' || r == '\n' || r == '(' || r == ')' || r == '`'
	})
	var out []string
	for _, x := range f {
		x = strings.TrimSpace(x)
		if x != "" {
			out = append(out, strings.Join(strings.Fields(x), " "))
		}
	}
	return out
}

func (p *Policy) decide(line string) Decision {
	if len(line) > MaxCommand {
		a := Ask
		for _, r := range p.Rules {
			if r.Action == Deny && r.Pattern == "*" {
				a = Deny
			}
		}
		return Decision{Action: a, Command: line[:256] + "…", Rule: "(command too long to match)"}
	}
	best, bestScore := -1, -1
	for i, r := range p.Rules {
		if !Match(r.Pattern, line) {
			continue
		}
		sc := literal(r.Pattern)
		if sc > bestScore || sc == bestScore && r.Action.rank() > p.Rules[best].Action.rank() {
			best, bestScore = i, sc
		}
	}
	if best < 0 {
		return Decision{Action: Allow, Command: line}
	}
	return Decision{Action: p.Rules[best].Action, Rule: p.Rules[best].Pattern, Command: line}
}

// literal counts a pattern's literal characters.
func literal(p string) int {
	return len(p) - strings.Count(p, "*") - strings.Count(p, "?")
}

// Match reports whether the glob pattern matches all of s (see Rule). It
// takes time proportional to len(pattern) * len(s) at worst.
func Match(pattern, s string) bool {
	if strings.HasSuffix(pattern, " *") && s == pattern[:len(pattern)-2] {
		return true
	}
	// Iterative matching with one backtrack point: the last star.
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(pattern) && (pattern[pi] == '?' || pattern[pi] == s[si]) && pattern[pi] != '*':
			pi++
			si++
		case pi < len(pattern) && pattern[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(pattern) && pattern[pi] == '*' {
		pi++
	}
	return pi == len(pattern)
}
