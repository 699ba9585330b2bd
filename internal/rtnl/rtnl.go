// Package rtnl configures network interfaces through rtnetlink: link
// state and MAC address, IPv4 addresses and the default route. It is the
// few requests the vm runtime needs on both sides of a VM's network
// device (the host's TAP and the guest's NIC), without running ip(8).
package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn is a NETLINK_ROUTE socket.
type Conn struct {
	fd  int
	seq uint32
}

// Dial opens a NETLINK_ROUTE socket.
func Dial() (*Conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("rtnetlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rtnetlink bind: %w", err)
	}
	return &Conn{fd: fd}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return unix.Close(c.fd) }

// SetUp sets or clears IFF_UP on interface index.
func (c *Conn) SetUp(index int, up bool) error {
	info := unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: int32(index), Change: unix.IFF_UP}
	if up {
		info.Flags = unix.IFF_UP
	}
	if err := c.do(unix.RTM_NEWLINK, 0, structBytes(&info, unix.SizeofIfInfomsg)); err != nil {
		return fmt.Errorf("set interface %d %s: %w", index, map[bool]string{true: "up", false: "down"}[up], err)
	}
	return nil
}

// SetMAC sets interface index's hardware address (the link should be
// down).
func (c *Conn) SetMAC(index int, mac net.HardwareAddr) error {
	info := unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: int32(index)}
	b := structBytes(&info, unix.SizeofIfInfomsg)
	b = appendAttr(b, unix.IFLA_ADDRESS, mac)
	if err := c.do(unix.RTM_NEWLINK, 0, b); err != nil {
		return fmt.Errorf("set the MAC of interface %d to %s: %w", index, mac, err)
	}
	return nil
}

// ReplaceAddr makes p the only IPv4 address of interface index: every
// other IPv4 address on it is removed first.
func (c *Conn) ReplaceAddr(index int, p netip.Prefix) error {
	if !p.Addr().Is4() {
		return fmt.Errorf("address %s: only IPv4 is supported", p)
	}
	ifc, err := net.InterfaceByIndex(index)
	if err != nil {
		return fmt.Errorf("interface %d: %w", index, err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", ifc.Name, err)
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.To4() == nil {
			continue
		}
		old, _ := netip.AddrFromSlice(n.IP.To4())
		bits, _ := n.Mask.Size()
		if netip.PrefixFrom(old, bits) == p {
			continue
		}
		if err := c.addr(unix.RTM_DELADDR, 0, index, netip.PrefixFrom(old, bits)); err != nil {
			return fmt.Errorf("remove %s/%d from %s: %w", old, bits, ifc.Name, err)
		}
	}
	if err := c.addr(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, index, p); err != nil {
		return fmt.Errorf("add %s to %s: %w", p, ifc.Name, err)
	}
	return nil
}

func (c *Conn) addr(typ uint16, flags uint16, index int, p netip.Prefix) error {
	msg := unix.IfAddrmsg{Family: unix.AF_INET, Prefixlen: uint8(p.Bits()), Index: uint32(index)}
	b := structBytes(&msg, unix.SizeofIfAddrmsg)
	a := p.Addr().As4()
	b = appendAttr(b, unix.IFA_LOCAL, a[:])
	b = appendAttr(b, unix.IFA_ADDRESS, a[:])
	return c.do(typ, flags, b)
}

// ReplaceDefaultRoute makes the IPv4 default route go through gw on
// interface index.
func (c *Conn) ReplaceDefaultRoute(index int, gw netip.Addr) error {
	if !gw.Is4() {
		return fmt.Errorf("gateway %s: only IPv4 is supported", gw)
	}
	msg := unix.RtMsg{Family: unix.AF_INET, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_BOOT,
		Scope: unix.RT_SCOPE_UNIVERSE, Type: unix.RTN_UNICAST}
	b := structBytes(&msg, unix.SizeofRtMsg)
	g := gw.As4()
	b = appendAttr(b, unix.RTA_GATEWAY, g[:])
	b = appendAttr(b, unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(index)))
	if err := c.do(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, b); err != nil {
		return fmt.Errorf("default route via %s on interface %d: %w", gw, index, err)
	}
	return nil
}

// do sends one request and waits for the kernel's acknowledgement.
func (c *Conn) do(typ uint16, flags uint16, body []byte) error {
	c.seq++
	h := unix.NlMsghdr{Len: uint32(unix.SizeofNlMsghdr + len(body)), Type: typ,
		Flags: flags | unix.NLM_F_REQUEST | unix.NLM_F_ACK, Seq: c.seq}
	msg := append(structBytes(&h, unix.SizeofNlMsghdr), body...)
	if err := unix.Sendto(c.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, os.Getpagesize())
	for {
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != c.seq || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if len(m.Data) < 4 {
				return errors.New("short netlink acknowledgement")
			}
			if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
				return unix.Errno(-e)
			}
			return nil
		}
	}
}

// structBytes copies a netlink struct of size n into a new slice.
func structBytes[T any](v *T, n int) []byte {
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(v)), n)...)
}

// appendAttr appends an rtattr, padded to 4 bytes.
func appendAttr(b []byte, typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
