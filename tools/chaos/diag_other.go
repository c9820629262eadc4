//go:build !linux

package main

import (
	"errors"
	"net/netip"
)

// tcpInode needs Linux' sock_diag: elsewhere senders stay unknown.
func tcpInode(src, dst netip.AddrPort) (uint64, error) {
	return 0, errors.New("sender lookup needs Linux")
}

func socketOwners(map[int]string) map[uint64]string { return nil }
