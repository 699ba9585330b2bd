package ns

// NetPid returns the pid (in the host's pid namespace) of the sandbox's
// init process, whose network namespace is the sandbox's: what the host
// side of its network attaches to.
func (in *instance) NetPid() int {
	return in.pid
}
