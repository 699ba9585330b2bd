package serial

// Clone returns a UART with u's registers and pending input, wired to
// cfg's output and interrupt line: the UART of a forked machine.
func (u *UART) Clone(cfg Config) *UART {
	u.mu.Lock()
	defer u.mu.Unlock()
	return &UART{cfg: cfg, ier: u.ier, lcr: u.lcr, mcr: u.mcr, scr: u.scr, dll: u.dll, dlm: u.dlm,
		fcr: u.fcr, msr: u.msr, thri: u.thri, rx: append([]byte(nil), u.rx...), irqHigh: u.irqHigh}
}

// State is a UART's driver-visible state: its registers and pending
// input, as saved with a machine image.
type State struct {
	IER, LCR, MCR, SCR, DLL, DLM, FCR, MSR uint8
	THRI, IRQHigh                          bool
	RX                                     []byte // at most MaxRX bytes
}

// MaxRX is the most pending input a UART holds.
const MaxRX = rxFIFOMax

// State returns the UART's state.
func (u *UART) State() State {
	u.mu.Lock()
	defer u.mu.Unlock()
	return State{IER: u.ier, LCR: u.lcr, MCR: u.mcr, SCR: u.scr, DLL: u.dll, DLM: u.dlm, FCR: u.fcr, MSR: u.msr,
		THRI: u.thri, IRQHigh: u.irqHigh, RX: append([]byte(nil), u.rx...)}
}

// NewFromState returns a UART with s's registers and pending input (cut
// to MaxRX), wired to cfg's output and interrupt line.
func NewFromState(cfg Config, s State) *UART {
	rx := s.RX
	if len(rx) > MaxRX {
		rx = rx[:MaxRX]
	}
	u := &UART{cfg: cfg, ier: s.IER, lcr: s.LCR, mcr: s.MCR, scr: s.SCR, dll: s.DLL, dlm: s.DLM, fcr: s.FCR, msr: s.MSR,
		thri: s.THRI, irqHigh: s.IRQHigh}
	if len(rx) > 0 {
		u.rx = append([]byte(nil), rx...)
	}
	return u
}
