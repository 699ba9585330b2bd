package gateway

import (
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"tine/netpolicy"
)

func query(t testing.TB, name string, typ dnsmessage.Type) []byte {
	m := dnsmessage.Message{Header: dnsmessage.Header{ID: 7, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}}}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAnswer(t *testing.T) {
	p, _ := netpolicy.Parse("allow", []string{"ok.test", "*.wild.test"})
	gw := [4]byte{10, 213, 0, 1}
	for _, c := range []struct {
		name  string
		typ   dnsmessage.Type
		rcode dnsmessage.RCode
		n     int
	}{
		{"ok.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1},
		{"OK.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1},
		{"ok.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, 0},
		{"ok.test.", dnsmessage.TypeTXT, dnsmessage.RCodeSuccess, 0},
		{"x.wild.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1},
		{"wild.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"no.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"1.2.3.4.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
	} {
		var m dnsmessage.Message
		if err := m.Unpack(Answer(p, gw, query(t, c.name, c.typ))); err != nil {
			t.Fatal(err)
		}
		if m.RCode != c.rcode || len(m.Answers) != c.n || m.ID != 7 {
			t.Errorf("%s %v: rcode %v, %d answers", c.name, c.typ, m.RCode, len(m.Answers))
		}
		if c.n == 1 && m.Answers[0].Body.(*dnsmessage.AResource).A != gw {
			t.Errorf("%s: answer %v, want the gateway", c.name, m.Answers[0].Body)
		}
	}
	if Answer(p, gw, []byte{1, 2, 3}) != nil {
		t.Error("answered garbage")
	}
	// A local name gets the gateway whatever the list; not without it.
	for _, local := range [][]string{nil, {"tine.internal"}} {
		var m dnsmessage.Message
		if err := m.Unpack(Answer(p, gw, query(t, "TINE.internal.", dnsmessage.TypeA), local...)); err != nil {
			t.Fatal(err)
		}
		if want := len(local); len(m.Answers) != want {
			t.Errorf("tine.internal with local names %v: %d answers, rcode %v", local, len(m.Answers), m.RCode)
		}
	}
}

// FuzzAnswer feeds the resolver arbitrary packets: it must not panic, and
// whatever it answers must parse and never carry an address other than
// the gateway's.
func FuzzAnswer(f *testing.F) {
	f.Add(query(f, "ok.test.", dnsmessage.TypeA))
	f.Add(query(f, "x.wild.test.", dnsmessage.TypeTXT))
	f.Add(query(f, "no.test.", dnsmessage.TypeA))
	f.Add([]byte{0, 1, 1, 0, 0, 2, 0, 0, 0, 0, 0, 0})
	p, _ := netpolicy.Parse("allow", []string{"ok.test", "*.wild.test"})
	gw := [4]byte{10, 213, 0, 1}
	f.Fuzz(func(t *testing.T, q []byte) {
		b := Answer(p, gw, q)
		if b == nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(b); err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		for _, a := range m.Answers {
			if r, ok := a.Body.(*dnsmessage.AResource); !ok || r.A != gw {
				t.Fatalf("answer %v", a.Body)
			}
		}
	})
}
