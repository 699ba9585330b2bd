package gateway

import (
	"errors"
	"io"
	"log"
	"net"
	"net/netip"
	"sync"
	"syscall"
)

type syscallRawConn = syscall.RawConn

// dest is a destination a connection reached.
type dest struct {
	name string
	port uint16
}

type connKey struct{}

// conn is a sandbox's connection to the gateway, tracked so that a policy
// change can close it.
type conn struct {
	net.Conn
	g     *Gateway
	local uint16 // the gateway port it came in on
	// Set by a CONNECT before the connection is handed to the TLS or
	// HTTP server: the only name (and port) it may go on to.
	expect string
	port   uint16
	pre    []byte // bytes read ahead by the proxy server
	dests  map[dest]struct{}
	peer   io.Closer // a tunnel's upstream connection
	once   sync.Once
}

func (c *conn) Read(b []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(b, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

func (c *conn) Close() error {
	var err error
	c.once.Do(func() {
		err = c.Conn.Close()
		c.g.mu.Lock()
		delete(c.g.conns, c)
		p := c.peer
		c.g.mu.Unlock()
		if p != nil {
			p.Close()
		}
	})
	return err
}

func (c *conn) setPeer(p io.Closer) {
	c.g.mu.Lock()
	c.peer = p
	c.g.mu.Unlock()
}

// accept tracks each connection from ln and hands it to q.
func (g *Gateway) accept(ln net.Listener, q *queue, port uint16) {
	defer g.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		c := &conn{Conn: nc, g: g, local: port}
		g.mu.Lock()
		if g.closed || len(g.conns) >= maxConns {
			g.mu.Unlock()
			nc.Close()
			continue
		}
		g.conns[c] = struct{}{}
		g.mu.Unlock()
		if !q.push(c) {
			c.Close()
		}
	}
}

// maxConns bounds the connections one sandbox holds open at once.
const maxConns = 4096

// queue is a net.Listener fed by the gateway (accepted or CONNECTed
// connections) for an http.Server.
type queue struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newQueue(a netip.Addr) *queue {
	return &queue{addr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, 0)), ch: make(chan net.Conn), done: make(chan struct{})}
}

func (q *queue) push(c net.Conn) bool {
	select {
	case q.ch <- c:
		return true
	case <-q.done:
		return false
	}
}

func (q *queue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *queue) Close() error   { q.once.Do(func() { close(q.done) }); return nil }
func (q *queue) Addr() net.Addr { return q.addr }

func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }
