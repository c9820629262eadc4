// Package netguard keeps endpoints that come from rules on the public
// internet. Rules are written by a project's users, who are not trusted: a
// webhook, Slack or Telegram-hook URL must not reach Klaxon's own network
// (Redis, RabbitMQ, a cloud's metadata service at 169.254.169.254).
//
// The decisions, in the order a send meets them:
//
//   - CheckEndpoint refuses a URL before anything is sent: a scheme other
//     than http or https, user info (user:pass@, which net/http would turn
//     into an Authorization header), and for Slack, Loop and Telegram hooks
//     a host or path outside the operator's patterns, or a path with a dot
//     segment ("/services/../admin"), which would lead out of a pattern's
//     path prefix once the server resolved it.
//   - The dialer of Client checks every address it connects to, after DNS
//     resolution, in its Control hook: names, DNS rebinding, IPv4-mapped and
//     NAT64 forms and every connection are covered by the one check that
//     sees the address the socket really connects to.
//   - Client never follows a redirect (a public URL could redirect inside):
//     the 3xx is the answer, and a permanent failure.
//   - Client ignores the proxy variables (HTTP_PROXY, …): a proxy would make
//     the connection, and the check would see only the proxy's address.
//
// Policy.Allow opts networks in (KLAXON_ALLOW_PRIVATE_NETWORKS); public
// addresses are reached only on Policy.Ports (KLAXON_ALLOW_PORTS, 80 and 443
// by default), allowed networks on any port. Addresses the operator
// configures (SMTP, the Telegram Bot API, Redis, RabbitMQ, MongoDB) do not
// go through this package.
package netguard

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Names of the settings that widen the policy, for the reasons of refusals.
const (
	SettingAllowNetworks = "KLAXON_ALLOW_PRIVATE_NETWORKS"
	SettingAllowPorts    = "KLAXON_ALLOW_PORTS"
)

// DefaultPorts are the ports public addresses are reached on.
var defaultPorts = []uint16{80, 443}

// Policy says which addresses endpoints from rules may connect to. The zero
// value allows public addresses on ports 80 and 443 only.
type Policy struct {
	// Allow lists networks that may be reached besides the public internet,
	// on any port: an operator's own webhook receivers, or 127.0.0.0/8 and
	// ::1/128 for tests and the demo.
	Allow []netip.Prefix
	// Ports are the ports public addresses may be reached on; nil means 80
	// and 443.
	Ports []uint16
}

// Error is an endpoint refused by the policy. It never holds the URL, which
// may embed a token: an address, a host or a port at most. A refusal is
// permanent: the same endpoint is refused again until the rule changes.
type Error struct {
	Reason string // e.g. "it resolves to 10.0.0.7, a private address; …"
}

func (e *Error) Error() string { return "endpoint refused: " + e.Reason }

// IsRefused reports whether err, or an error it wraps, is a refusal.
func IsRefused(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// Check reports whether a connection to ap is allowed: nil, or an *Error
// saying why not and which setting would allow it.
func (p Policy) Check(ap netip.AddrPort) error {
	addr := ap.Addr().WithZone("")
	if p.allowed(addr) {
		return nil
	}
	if class := Classify(addr); class != "" {
		return &Error{Reason: fmt.Sprintf("it resolves to %s, %s address; allow it with %s",
			addr.Unmap(), class, SettingAllowNetworks)}
	}
	ports := p.Ports
	if ports == nil {
		ports = defaultPorts
	}
	if !slices.Contains(ports, ap.Port()) {
		list := make([]string, len(ports))
		for i, port := range ports {
			list[i] = strconv.Itoa(int(port))
		}
		return &Error{Reason: fmt.Sprintf("port %d is not one of %s; allow it with %s",
			ap.Port(), strings.Join(list, ", "), SettingAllowPorts)}
	}
	return nil
}

// allowed reports whether an allowed network holds addr, in either of its
// forms (::ffff:10.0.0.7 is 10.0.0.7).
func (p Policy) allowed(addr netip.Addr) bool {
	for _, n := range p.Allow {
		if n.Contains(addr) || n.Contains(addr.Unmap()) {
			return true
		}
	}
	return false
}

// special are the ranges that are not the public internet, with the words
// a refusal uses for them. Longer prefixes come first where they overlap.
var special = []struct {
	prefix netip.Prefix
	class  string
}{
	// IPv4 (IANA IPv4 Special-Purpose Address Registry).
	{netip.MustParsePrefix("0.0.0.0/8"), "a \"this network\""},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "a reserved"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation"},
	{netip.MustParsePrefix("192.31.196.0/24"), "a reserved"},
	{netip.MustParsePrefix("192.52.193.0/24"), "a reserved"},
	{netip.MustParsePrefix("192.88.99.0/24"), "a reserved (6to4 relay)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private"},
	{netip.MustParsePrefix("192.175.48.0/24"), "a reserved"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "the broadcast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved"},
	// IPv6 (IANA IPv6 Special-Purpose Address Registry). Mapped
	// (::ffff:0:0/96), NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses
	// are judged by the IPv4 address they carry, in Classify.
	{netip.MustParsePrefix("::/128"), "an unspecified"},
	{netip.MustParsePrefix("::1/128"), "a loopback"},
	{netip.MustParsePrefix("::/96"), "a reserved (IPv4-compatible)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a private (local NAT64)"},
	{netip.MustParsePrefix("100::/64"), "a reserved (discard)"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation"},
	{netip.MustParsePrefix("2001::/23"), "a reserved (IETF protocol assignments, Teredo)"},
	{netip.MustParsePrefix("3fff::/20"), "a documentation"},
	{netip.MustParsePrefix("fc00::/7"), "a private (unique local)"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local"},
	{netip.MustParsePrefix("fec0::/10"), "a reserved (site-local)"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast"},
}

var (
	nat64    = netip.MustParsePrefix("64:ff9b::/96")
	six2four = netip.MustParsePrefix("2002::/16")
	global   = netip.MustParsePrefix("2000::/3")
)

// Classify says which kind of non-public address addr is, in words that
// follow "an address that is…" ("a private", "a loopback", …), or "" for
// an address of the public internet. An IPv6 address that carries an IPv4
// one (::ffff:10.0.0.7, 64:ff9b::a00:7, 2002:a00:7::) is what that IPv4
// address is; IPv6 outside 2000::/3, the global unicast space, is reserved.
func Classify(addr netip.Addr) string {
	addr = addr.WithZone("").Unmap()
	if !addr.IsValid() {
		return "an invalid"
	}
	if addr.Is6() {
		b := addr.As16()
		switch {
		case nat64.Contains(addr):
			return Classify(netip.AddrFrom4([4]byte(b[12:16])))
		case six2four.Contains(addr):
			return Classify(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	for _, s := range special {
		if s.prefix.Contains(addr) {
			return s.class
		}
	}
	if addr.Is6() && !global.Contains(addr) {
		return "a reserved"
	}
	return ""
}
