package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/klaxonhq/klaxon/internal/netguard"
)

// What endpoints from rules may reach is stored in canonical form, so that
// writing a default out changes nothing.

func canonicalNetworks(v string) (string, error) {
	nets, err := parseNetworks(v)
	return joinStrings(nets), err
}

func canonicalPorts(v string) (string, error) {
	ports, err := parsePorts(v)
	return joinStrings(ports), err
}

func canonicalPatterns(v string) (string, error) {
	ps, err := netguard.ParsePatterns(v)
	return joinStrings(ps), err
}

// parseNetworks reads comma-separated CIDRs; a bare address stands for
// itself alone (/32, /128).
func parseNetworks(v string) ([]netip.Prefix, error) {
	var nets []netip.Prefix
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if !strings.Contains(item, "/") {
			a, err := netip.ParseAddr(item)
			if err != nil || a.Zone() != "" {
				return nil, fmt.Errorf("%q is not a CIDR (such as 10.0.0.0/8 or fd00::/8) or an IP address", item)
			}
			nets = append(nets, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR (such as 10.0.0.0/8 or fd00::/8)", item)
		}
		if p != p.Masked() {
			// 10.0.0.1/8 is 10.0.0.0/8 to a router; a reader may have
			// meant 10.0.0.1 alone.
			return nil, fmt.Errorf("%q has bits set after its /%d: write %s, or %s/%d for the one address",
				item, p.Bits(), p.Masked(), p.Addr(), p.Addr().BitLen())
		}
		nets = append(nets, p)
	}
	return nets, nil
}

func parsePorts(v string) ([]uint16, error) {
	var ports []uint16
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		n, err := strconv.Atoi(item)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%q is not a port from 1 to 65535", item)
		}
		if !slices.Contains(ports, uint16(n)) {
			ports = append(ports, uint16(n))
		}
	}
	if len(ports) == 0 {
		return nil, fmt.Errorf("%q names no port", v)
	}
	return ports, nil
}

func joinStrings[T any](items []T) string {
	s := make([]string, len(items))
	for i, it := range items {
		s[i] = fmt.Sprint(it)
	}
	return strings.Join(s, ",")
}

// EndpointPolicy is what endpoints from rules may reach:
// KLAXON_ALLOW_PRIVATE_NETWORKS and KLAXON_ALLOW_PORTS.
func (c Config) EndpointPolicy() netguard.Policy {
	// Load validated both; a Config built by hand with bad values gets the
	// strictest policy rather than a panic.
	nets, _ := parseNetworks(c.AllowPrivateNetworks)
	ports, err := parsePorts(c.AllowPorts)
	if err != nil {
		ports = nil
	}
	return netguard.Policy{Allow: nets, Ports: ports}
}

// SlackPatterns are the hosts a Slack endpoint must match (KLAXON_SLACK_HOSTS).
func (c Config) SlackPatterns() []netguard.Pattern {
	return mustPatterns(c.SlackHosts, defaultSlackHosts)
}

// TelegramHookPatterns are the hosts a Telegram hook URL must match
// (KLAXON_TELEGRAM_HOOK_HOSTS).
func (c Config) TelegramHookPatterns() []netguard.Pattern {
	return mustPatterns(c.TelegramHookHosts, defaultTelegramHooks)
}

// LoopPatterns are the hosts a Loop endpoint must match (KLAXON_LOOP_HOSTS).
func (c Config) LoopPatterns() []netguard.Pattern {
	return mustPatterns(c.LoopHosts, defaultLoopHosts)
}

func mustPatterns(v, def string) []netguard.Pattern {
	ps, err := netguard.ParsePatterns(v)
	if err != nil {
		ps, _ = netguard.ParsePatterns(def)
	}
	return ps
}
