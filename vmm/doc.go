// Package vmm is tine's tiny KVM virtual machine monitor: it boots bare
// guests and Linux, captures and restores complete machine state, seals
// guest memory into immutable images and forks running machines into
// copy-on-write children.
//
// A VM (New) has RAM backed by a sparse memfd, vCPUs on their own locked
// OS threads, port and MMIO device hooks, and an optional in-kernel
// irqchip and PIT. LoadBare prepares a bare guest: a flat 64-bit program
// entered at CPL3 that talks to the VMM with OUT instructions (console,
// report, snapshot, fork, exit). Run drives the vCPUs until the guest
// exits or faults; a fault ends only that VM, with a *GuestError.
//
// Seal turns RAM into an immutable Image (the VM goes on as its child);
// Image.Fork makes children that map it MAP_PRIVATE or fill it lazily
// through userfaultfd; a Pool of empty VMs made ahead takes VM creation
// off the fork path. Snapshot stores state and pages in a chunkstore.Store
// as a tree of nodes over 4 KiB page chunks, incrementally with KVM's
// dirty log; LoadSnapshot and OpenSnapshotLazy bring one back, in any
// process. docs/vmm.md describes the design and what PVM hosts do
// differently.
package vmm
