package serial

// Clone returns a UART with u's registers and pending input, wired to
// cfg's output and interrupt line: the UART of a forked machine.
func (u *UART) Clone(cfg Config) *UART {
	u.mu.Lock()
	defer u.mu.Unlock()
	return &UART{cfg: cfg, ier: u.ier, lcr: u.lcr, mcr: u.mcr, scr: u.scr, dll: u.dll, dlm: u.dlm,
		fcr: u.fcr, msr: u.msr, thri: u.thri, rx: append([]byte(nil), u.rx...), irqHigh: u.irqHigh}
}
