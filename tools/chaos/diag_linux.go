package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"syscall"
)

// Linux sock_diag (netlink) constants: include/uapi/linux/sock_diag.h and
// inet_diag.h.
const (
	sockDiagByFamily = 20         // SOCK_DIAG_BY_FAMILY
	noCookie         = 0xffffffff // INET_DIAG_NOCOOKIE
	reqLen           = 16 + 56    // nlmsghdr + inet_diag_req_v2
	inodeOffset      = 16 + 68    // nlmsghdr + inet_diag_msg up to idiag_inode
)

// tcpInode asks the kernel for the socket inode of the TCP connection
// src → dst, as its owner sees it: one exact lookup, however many
// connections there are (/proc/net/tcp lists them all). An inode of 0 is a
// socket no process holds any more; errGone means there is no such socket.
func tcpInode(src, dst netip.AddrPort) (uint64, error) {
	if !src.Addr().Is4() || !dst.Addr().Is4() {
		return 0, errors.New("IPv4 only")
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, syscall.NETLINK_INET_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag socket: %w", err)
	}
	defer syscall.Close(fd)

	req := make([]byte, reqLen)
	le := binary.LittleEndian // netlink headers are in host order (amd64, arm64: little)
	le.PutUint32(req[0:], reqLen)
	le.PutUint16(req[4:], sockDiagByFamily)
	le.PutUint16(req[6:], syscall.NLM_F_REQUEST)
	le.PutUint32(req[8:], 1) // seq
	r := req[16:]
	r[0], r[1] = syscall.AF_INET, syscall.IPPROTO_TCP
	le.PutUint32(r[4:], 0xffffffff) // every state
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], src.Port())
	binary.BigEndian.PutUint16(id[2:], dst.Port())
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(id[4:], s4[:])
	copy(id[20:], d4[:])
	le.PutUint32(id[40:], noCookie)
	le.PutUint32(id[44:], noCookie)
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag request: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := syscall.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("sock_diag reply: %w", err)
	}
	if n < 16 {
		return 0, errors.New("sock_diag reply too short")
	}
	switch le.Uint16(buf[4:]) {
	case syscall.NLMSG_ERROR:
		if n >= 20 && int32(le.Uint32(buf[16:])) == -int32(syscall.ENOENT) {
			return 0, errGone
		}
		return 0, fmt.Errorf("sock_diag error %d", -int32(le.Uint32(buf[16:])))
	case sockDiagByFamily:
		if n < inodeOffset+4 {
			return 0, errors.New("sock_diag reply too short")
		}
		return uint64(le.Uint32(buf[inodeOffset:])), nil
	}
	return 0, fmt.Errorf("sock_diag reply of type %d", le.Uint16(buf[4:]))
}

// socketOwners maps the socket inodes the given processes hold to their
// names, from /proc/<pid>/fd.
func socketOwners(procs map[int]string) map[uint64]string {
	out := map[uint64]string{}
	for pid, name := range procs {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			var buf [64]byte
			n, err := syscall.Readlink(dir+"/"+e.Name(), buf[:])
			if err != nil {
				continue
			}
			link := string(buf[:n])
			if len(link) > 9 && link[:8] == "socket:[" && link[len(link)-1] == ']' {
				if inode, err := strconv.ParseUint(link[8:len(link)-1], 10, 64); err == nil {
					out[inode] = name
				}
			}
		}
	}
	return out
}
