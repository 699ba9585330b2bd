// Package vmm is tine's tiny KVM virtual machine monitor: it boots bare
// guests and Linux, captures and restores complete machine state, seals
// guest memory into immutable images and forks running machines into
// copy-on-write children.
package vmm
