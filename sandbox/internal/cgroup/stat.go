package cgroup

import "golang.org/x/sys/unix"

type unixStat = unix.Stat_t

func stat(path string, st *unix.Stat_t) error { return unix.Stat(path, st) }
func devMajor(d uint64) uint32                { return unix.Major(d) }
func devMinor(d uint64) uint32                { return unix.Minor(d) }
