//go:build !amd64

package ns

// auditArch 0: no filter for this architecture yet; Start fails.
const auditArch = 0

var denied []uintptr
