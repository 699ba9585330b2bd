package virtio

import (
	"io"
	"sync"
)

// MaxConsoleBacklog bounds the host input waiting for the guest's
// receive buffers; input beyond it is dropped and counted.
const MaxConsoleBacklog = 64 << 10

// maxConsoleChain bounds one transmit chain.
const maxConsoleChain = 1 << 20

// Console is a virtio console (type 3) with one port: queue 0 receives
// host input, queue 1 transmits guest output to Output.
type Console struct {
	// Output receives what the guest writes (hvc0); nil discards it.
	Output io.Writer

	mu      sync.Mutex
	backlog []byte
	dropped uint64
	t       *Transport
}

// Type implements Device.
func (c *Console) Type() uint32 { return TypeConsole }

// Features implements Device: no size, no multiport.
func (c *Console) Features() uint64 { return 0 }

// QueueMax implements Device.
func (c *Console) QueueMax() []uint16 { return []uint16{MaxQueueSize, MaxQueueSize} }

// ReadConfig implements Device: without features the space is unused.
func (c *Console) ReadConfig(off uint64, data []byte) {}

// WriteConfig implements Device.
func (c *Console) WriteConfig(off uint64, data []byte) {}

// Reset implements Device.
func (c *Console) Reset() {}

// Dropped is how many input bytes did not fit the backlog.
func (c *Console) Dropped() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped
}

// Send queues host input for the guest; it is delivered as the guest
// offers receive buffers.
func (c *Console) Send(t *Transport, p []byte) {
	c.mu.Lock()
	room := MaxConsoleBacklog - len(c.backlog)
	if len(p) > room {
		c.dropped += uint64(len(p) - room)
		p = p[:room]
	}
	c.backlog = append(c.backlog, p...)
	c.mu.Unlock()
	t.Do(func() error { return c.deliver(t) })
}

func (c *Console) deliver(t *Transport) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := t.Queue(0)
	for len(c.backlog) > 0 {
		ch, err := q.Pop(t.Mem(), maxConsoleChain)
		if err != nil || ch == nil {
			return err
		}
		w := ch.NewWriter()
		n := min(uint64(len(c.backlog)), w.Room())
		w.Write(c.backlog[:n])
		c.backlog = c.backlog[n:]
		if err := t.Used(0, ch.Head, w.Written()); err != nil {
			return err
		}
	}
	return nil
}

// Notify implements Device.
func (c *Console) Notify(t *Transport, q int) error {
	if q == 0 {
		return c.deliver(t)
	}
	qu := t.Queue(q)
	for range maxPerNotify {
		ch, err := qu.Pop(t.Mem(), maxConsoleChain)
		if err != nil || ch == nil {
			return err
		}
		if c.Output != nil {
			for _, s := range ch.Readable {
				c.Output.Write(s)
			}
		}
		if err := t.Used(q, ch.Head, 0); err != nil {
			return err
		}
	}
	return nil
}
