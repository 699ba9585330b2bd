// Package guestagent is the agent that runs inside each sandbox and reports
// its processes and listening ports to the host, and runs commands for it.
package guestagent
