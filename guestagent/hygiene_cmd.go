package guestagent

import (
	"errors"

	"tine/guestagent/proto"
)

// hygiene answers a HygieneRequest: it applies it (GenerationFile under
// "/", the VM's own root) and answers End, or Error naming what failed.
// An agent without Config.Hygiene refuses: in the ns runtime the kernel
// and its clock are the host's.
func (c *conn) hygiene(f proto.Frame) {
	if !c.a.cfg.Hygiene {
		c.fail(f.ID, errors.New("this guest agent does not own its kernel (not in a VM): hygiene requests are refused"))
		return
	}
	var req proto.HygieneRequest
	if err := proto.Decode(f, &req); err != nil {
		c.fail(f.ID, err)
		return
	}
	if err := req.Check(); err != nil {
		c.fail(f.ID, err)
		return
	}
	h := Hygiene{Entropy: req.Entropy, Now: req.Now, Generation: req.Generation, Share: req.Share}
	if req.Net != nil {
		name, mac, addr, gw, err := req.Net.Parse()
		if err != nil {
			c.fail(f.ID, err)
			return
		}
		h.Net = &NetIdentity{Interface: name, MAC: mac, Addr: addr, Gateway: gw}
	}
	if err := ApplyHygiene("/", h); err != nil {
		c.fail(f.ID, err)
		return
	}
	c.send(proto.Frame{Kind: proto.KindEnd, ID: f.ID})
}
