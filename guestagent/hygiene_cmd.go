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
	if err := ApplyHygiene("/", Hygiene{Entropy: req.Entropy, Now: req.Now, Generation: req.Generation}); err != nil {
		c.fail(f.ID, err)
		return
	}
	if req.Share != nil {
		if err := MountShare(req.Share.Tag, req.Share.Path); err != nil {
			c.fail(f.ID, err)
			return
		}
	}
	c.send(proto.Frame{Kind: proto.KindEnd, ID: f.ID})
}
