package gateway

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"tine/netpolicy"
)

// dnsTTL is short, so that a policy change reaches the sandbox's caches
// quickly (the packet filter does not depend on it).
const dnsTTL = 5

// Answer builds the resolver's reply to one DNS query from the sandbox:
// allowed names get the gateway's address (A) or an empty answer (other
// types: the sandbox has no IPv6); other names NXDOMAIN. The local names
// (already normalized) get the gateway's address whatever the policy.
// Nothing is ever forwarded, so a query cannot carry data out. It returns
// nil for input that is not a query worth answering.
func Answer(p *netpolicy.Policy, gw [4]byte, query []byte, local ...string) []byte {
	var parser dnsmessage.Parser
	h, err := parser.Start(query)
	if err != nil || h.Response {
		return nil
	}
	qs, err := parser.AllQuestions()
	resp := dnsmessage.Message{Header: dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}}
	if err != nil || len(qs) != 1 || h.OpCode != 0 {
		resp.RCode = dnsmessage.RCodeFormatError
		if h.OpCode != 0 {
			resp.RCode = dnsmessage.RCodeNotImplemented
		}
		b, _ := resp.Pack()
		return b
	}
	q := qs[0]
	resp.Questions = qs
	name, nerr := netpolicy.NormalizeName(q.Name.String())
	switch {
	case q.Class != dnsmessage.ClassINET:
		resp.RCode = dnsmessage.RCodeRefused
	case nerr != nil || !p.AllowName(name, 0) && !slices.Contains(local, name) || isIPv4(name):
		resp.RCode = dnsmessage.RCodeNameError
	case q.Type == dnsmessage.TypeA:
		resp.Answers = []dnsmessage.Resource{{
			Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: dnsTTL},
			Body:   &dnsmessage.AResource{A: gw},
		}}
	}
	b, err := resp.Pack()
	if err != nil {
		return nil
	}
	return b
}

func (g *Gateway) answer(q []byte) []byte {
	return Answer(g.Policy(), g.cfg.Addr.As4(), q, g.cfg.Local...)
}

func (g *Gateway) serveDNSUDP() {
	defer g.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := g.udp.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !fromPeer(from, g.cfg.Peer) {
			continue
		}
		if b := g.answer(buf[:n]); b != nil {
			if len(b) > 512 {
				b = b[:0] // never happens for one question and one A record
			}
			g.udp.WriteTo(b, from)
		}
	}
}

func (g *Gateway) serveDNSTCP(ln net.Listener) {
	defer g.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go func() {
			defer c.Close()
			for {
				c.SetDeadline(time.Now().Add(10 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				b := g.answer(q)
				if b == nil {
					return
				}
				out := binary.BigEndian.AppendUint16(nil, uint16(len(b)))
				if _, err := c.Write(append(out, b...)); err != nil {
					return
				}
			}
		}()
	}
}
