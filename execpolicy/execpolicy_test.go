package execpolicy

import "testing"

func TestDecide(t *testing.T) {
	p, err := ParseMap([]byte(`{"npm *": "allow", "rm -rf *": "deny", "*": "ask", "git status": "allow", "git push *": "deny"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		argv []string
		want Action
	}{
		{[]string{"npm", "install", "left-pad"}, Allow},
		{[]string{"npm"}, Allow},
		{[]string{"rm", "-rf", "/"}, Deny},
		{[]string{"rm", "file"}, Ask},
		{[]string{"git", "status"}, Allow},
		{[]string{"git", "push", "origin", "main"}, Deny},
		{[]string{"ls"}, Ask},
		{[]string{"sh", "-c", "npm test && rm -rf /"}, Deny},
		{[]string{"/bin/bash", "-lc", "npm test; ls"}, Ask},
		{[]string{"sh", "-c", "npm test"}, Allow},
		{[]string{"sh", "-c", "npm test $(rm -rf /)"}, Deny},
		{[]string{"sh", "-c", "echo `rm -rf /`"}, Deny},
	} {
		if d := p.Decide(c.argv); d.Action != c.want {
			t.Errorf("%q: %s by %q, want %s", c.argv, d.Action, d.Rule, c.want)
		}
	}
	if d := (&Policy{}).Decide([]string{"anything"}); d.Action != Allow {
		t.Errorf("empty policy: %s", d.Action)
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		p, s string
		want bool
	}{
		{"*", "", true}, {"a*c", "abbbc", true}, {"a*c", "abbb", false}, {"a?c", "abc", true},
		{"*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false}, {"npm *", "npm", true}, {"npm *", "npmx", false},
	} {
		if got := Match(c.p, c.s); got != c.want {
			t.Errorf("Match(%q, %q) = %v", c.p, c.s, got)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, b := range []string{`[]`, `{"x": 1}`, `{"x": "maybe"}`, `{"": "allow"}`, `{"a":"allow","a":"deny"}`} {
		if _, err := ParseMap([]byte(b)); err == nil {
			t.Errorf("ParseMap(%s) took it", b)
		}
	}
}

func FuzzParseDecide(f *testing.F) {
	f.Add([]byte(`{"npm *": "allow", "*": "ask"}`), "npm install")
	f.Add([]byte(`{"*a*b*": "deny"}`), "sh -c 'a;b'")
	f.Fuzz(func(t *testing.T, b []byte, cmd string) {
		p, err := ParseMap(b)
		if err != nil {
			return
		}
		d := p.Decide([]string{"sh", "-c", cmd})
		if d.Action != Allow && d.Action != Ask && d.Action != Deny {
			t.Fatalf("action %q", d.Action)
		}
	})
}

// TestBypassAttempts: spellings of a denied command. Those the splitter
// sees are denied; the others miss the deny rule, and with "*": "ask"
// they come to a person instead of running (docs/policy.md).
func TestBypassAttempts(t *testing.T) {
	p, _ := ParseMap([]byte(`{"npm *": "allow", "rm -rf *": "deny", "*": "ask"}`))
	for _, c := range []struct {
		argv []string
		want Action
	}{
		{[]string{"sh", "-c", "rm -rf /"}, Deny},
		{[]string{"sh", "-c", "npm test; rm -rf /"}, Deny},
		{[]string{"sh", "-c", "npm test && rm -rf /"}, Deny},
		{[]string{"sh", "-c", "npm test || rm -rf /"}, Deny},
		{[]string{"sh", "-c", "npm test | rm -rf /"}, Deny},
		{[]string{"sh", "-c", "npm test\nrm -rf /"}, Deny},
		{[]string{"sh", "-c", "npm test $(rm -rf /)"}, Deny},
		{[]string{"bash", "-c", "npm `rm -rf /`"}, Deny},
		{[]string{"/usr/bin/bash", "-ec", "(rm -rf /)"}, Deny},
		{[]string{"sh", "-c", "npm   test   ;   rm   -rf   /"}, Deny},
		// Missed by the deny rule, caught by "*": ask.
		{[]string{"/bin/rm", "-rf", "/"}, Ask},
		{[]string{"rm", "-r", "-f", "/"}, Ask},
		{[]string{"sh", "-c", "r''m -rf /"}, Ask},
		{[]string{"env", "rm", "-rf", "/"}, Ask},
		{[]string{"python3", "-c", "import shutil; shutil.rmtree('/')"}, Ask},
		{[]string{"npm", "exec", "--", "rimraf", "/"}, Allow}, // allowed by "npm *": a rule allows what it says
	} {
		if d := p.Decide(c.argv); d.Action != c.want {
			t.Errorf("%q: %s by %q, want %s", c.argv, d.Action, d.Rule, c.want)
		}
	}
}
