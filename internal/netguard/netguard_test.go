package netguard

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

// Every range that is not the public internet is refused, in each of the
// forms an IPv6 address can carry an IPv4 one; the public neighbours of
// each range are not.
func TestClassify(t *testing.T) {
	tests := []struct {
		addr  string
		class string // "" = public
	}{
		// IPv4
		{"0.0.0.0", "this network"},
		{"0.1.2.3", "this network"},
		{"10.0.0.7", "private"},
		{"11.0.0.1", ""},
		{"100.63.255.255", ""},
		{"100.64.0.1", "carrier-grade NAT"},
		{"100.127.255.255", "carrier-grade NAT"},
		{"100.128.0.0", ""},
		{"127.0.0.1", "loopback"},
		{"127.255.255.254", "loopback"},
		{"169.254.169.254", "link-local"},
		{"172.15.255.255", ""},
		{"172.16.0.1", "private"},
		{"172.31.255.255", "private"},
		{"172.32.0.0", ""},
		{"192.0.0.8", "reserved"},
		{"192.0.2.1", "documentation"},
		{"192.88.99.1", "6to4 relay"},
		{"192.168.1.1", "private"},
		{"198.18.0.1", "benchmarking"},
		{"198.19.255.255", "benchmarking"},
		{"198.20.0.0", ""},
		{"198.51.100.7", "documentation"},
		{"203.0.113.9", "documentation"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"240.0.0.1", "reserved"},
		{"255.255.255.255", "broadcast"},
		{"8.8.8.8", ""},
		{"1.1.1.1", ""},
		{"93.184.216.34", ""},
		// IPv6
		{"::", "unspecified"},
		{"::1", "loopback"},
		{"::7f00:1", "IPv4-compatible"},
		{"::ffff:127.0.0.1", "loopback"},
		{"::ffff:10.0.0.7", "private"},
		{"::ffff:169.254.169.254", "link-local"},
		{"::ffff:8.8.8.8", ""},
		{"64:ff9b::a00:7", "private"},        // NAT64 of 10.0.0.7
		{"64:ff9b::a9fe:a9fe", "link-local"}, // NAT64 of 169.254.169.254
		{"64:ff9b::808:808", ""},             // NAT64 of 8.8.8.8
		{"64:ff9b:1::1", "local NAT64"},      // local-use NAT64
		{"2002:7f00:1::1", "loopback"},       // 6to4 of 127.0.0.1
		{"2002:a9fe:a9fe::", "link-local"},   // 6to4 of 169.254.169.254
		{"2002:808:808::1", ""},              // 6to4 of 8.8.8.8
		{"2001::1", "Teredo"},                // Teredo
		{"2001:db8::1", "documentation"},
		{"3fff::1", "documentation"},
		{"100::1", "discard"},
		{"fc00::1", "unique local"},
		{"fd12:3456:789a::1", "unique local"},
		{"fe80::1", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"fec0::1", "site-local"},
		{"ff02::1", "multicast"},
		{"5f00::1", "reserved"}, // outside 2000::/3
		{"4000::1", "reserved"},
		{"2606:4700:4700::1111", ""},
		{"2a00:1450:4001::1", ""},
	}
	for _, tt := range tests {
		got := Classify(netip.MustParseAddr(tt.addr))
		switch {
		case tt.class == "" && got != "":
			t.Errorf("Classify(%s) = %q, want public", tt.addr, got)
		case tt.class != "" && !strings.Contains(got, tt.class):
			t.Errorf("Classify(%s) = %q, want %q", tt.addr, got, tt.class)
		}
	}
}

func TestCheck(t *testing.T) {
	allowLocal := Policy{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}}
	tests := []struct {
		name   string
		policy Policy
		addr   string
		want   string // "" = allowed, else a part of the reason
	}{
		{"public on 443", Policy{}, "8.8.8.8:443", ""},
		{"public on 80", Policy{}, "[2606:4700:4700::1111]:80", ""},
		{"public on 8080", Policy{}, "8.8.8.8:8080", "port 8080 is not one of 80, 443; allow it with KLAXON_ALLOW_PORTS"},
		{"public on a widened port", Policy{Ports: []uint16{443, 8443}}, "8.8.8.8:8443", ""},
		{"80 no longer in a widened list", Policy{Ports: []uint16{443, 8443}}, "8.8.8.8:80", "port 80 is not one of 443, 8443"},
		{"private", Policy{}, "10.0.0.7:443", "it resolves to 10.0.0.7, a private address; allow it with KLAXON_ALLOW_PRIVATE_NETWORKS"},
		{"metadata", Policy{}, "169.254.169.254:80", "169.254.169.254, a link-local address"},
		{"mapped loopback", Policy{}, "[::ffff:127.0.0.1]:80", "127.0.0.1, a loopback address"},
		{"loopback allowed, any port", allowLocal, "127.0.0.1:34567", ""},
		{"mapped loopback allowed", allowLocal, "[::ffff:127.0.0.1]:34567", ""},
		{"v6 loopback allowed", allowLocal, "[::1]:34567", ""},
		{"other private still refused", allowLocal, "10.0.0.7:80", "private"},
		{"allowed network, any port", Policy{Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}, "10.1.2.3:8080", ""},
		{"next to the allowed network", Policy{Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}, "10.2.0.1:80", "private"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.policy.Check(netip.MustParseAddrPort(tt.addr))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && err == nil:
				t.Errorf("allowed, want %q", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Errorf("reason %q, want %q", err, tt.want)
			case err != nil && !IsRefused(err):
				t.Errorf("%v is not an *Error", err)
			}
		})
	}
}

// The Control hook refuses without a socket: no packet leaves for an
// address that is not allowed.
func TestControlRefusesBeforeConnecting(t *testing.T) {
	var p Policy
	if err := p.control(t.Context(), "tcp4", "8.8.8.8:8080", nil); err == nil || !strings.Contains(err.Error(), "port 8080") {
		t.Errorf("8.8.8.8:8080: %v", err)
	}
	if err := p.control(t.Context(), "tcp4", "169.254.169.254:80", nil); err == nil || !strings.Contains(err.Error(), "link-local") {
		t.Errorf("169.254.169.254:80: %v", err)
	}
	if err := p.control(t.Context(), "tcp4", "8.8.8.8:443", nil); err != nil {
		t.Errorf("8.8.8.8:443: %v", err)
	}
}

func TestParsePatterns(t *testing.T) {
	good := map[string]string{
		"hooks.slack.com/services/":          "hooks.slack.com/services/",
		"Hooks.Slack.com./services/, ":       "hooks.slack.com/services/",
		"notify.bot.codex.so":                "notify.bot.codex.so",
		"*.example.com,127.0.0.1":            "*.example.com,127.0.0.1",
		"*":                                  "*",
		"[::1]/hook":                         "[::1]/hook",
		"hooks.slack.com/services/,10.0.0.1": "hooks.slack.com/services/,10.0.0.1",
	}
	for in, want := range good {
		ps, err := ParsePatterns(in)
		if err != nil {
			t.Errorf("ParsePatterns(%q): %v", in, err)
			continue
		}
		var got []string
		for _, p := range ps {
			got = append(got, p.String())
		}
		if strings.Join(got, ",") != want {
			t.Errorf("ParsePatterns(%q) = %v, want %s", in, got, want)
		}
	}
	for _, bad := range []string{"", " , ", "https://hooks.slack.com/services/", "*.", "a*b.com", "user@host", "host/path?x", "[zz]",
		"host/services/../admin/", "host/a/./b", "host/%2e%2E/", "host/.."} {
		if _, err := ParsePatterns(bad); err == nil {
			t.Errorf("ParsePatterns(%q) accepted", bad)
		}
	}
}

func TestCheckEndpoint(t *testing.T) {
	slack, _ := ParsePatterns("hooks.slack.com/services/")
	wild, _ := ParsePatterns("*.example.com")
	tests := []struct {
		url   string
		hosts []Pattern
		want  string // "" = accepted
	}{
		{"https://example.com/hook", nil, ""},
		{"http://example.com:8080/hook", nil, ""}, // ports are the Policy's
		{"https://user:secret@example.com/hook", nil, "user name or password"},
		{"https://user@example.com/hook", nil, "user name or password"},
		{"ftp://example.com/hook", nil, "not an absolute http(s) URL"},
		{"/hook", nil, "not an absolute http(s) URL"},
		{"https://hooks.slack.com/services/T0/B0/x", slack, ""},
		{"https://HOOKS.slack.com./services/T0/B0/x", slack, ""},
		{"https://hooks.slack.com/api/x", slack, "host hooks.slack.com with this path is not one of hooks.slack.com/services/ (SETTING)"},
		{"https://evil.example/services/T0", slack, "host evil.example"},
		{"https://hooks.slack.com.evil.example/services/T0", slack, "not one of"},
		{"https://a.example.com/x", wild, ""},
		{"https://example.com/x", wild, "not one of"},
		{"https://badexample.com/x", wild, "not one of"},
		// A server resolves dot segments before it routes, so they would
		// lead outside the prefix: refused, in whatever spelling a server
		// might decode ("%2e", "%2f", "\\", ";params"), even when the
		// path still starts with the prefix.
		{"https://hooks.slack.com/services/../admin/x", slack, "dot segment"},
		{"https://hooks.slack.com/services/./T0/B0/x", slack, "dot segment"},
		{"https://hooks.slack.com/services/T0/..", slack, "dot segment"},
		{"https://hooks.slack.com/services/%2e%2E/admin", slack, "dot segment"},
		{"https://hooks.slack.com/services/.%2E/admin", slack, "dot segment"},
		{"https://hooks.slack.com/services/..%2fadmin", slack, "dot segment"},
		{"https://hooks.slack.com/services/..%5Cadmin", slack, "dot segment"},
		{"https://hooks.slack.com/services/..;x/admin", slack, "dot segment"},
		{"https://hooks.slack.com/services/%252e%252e/admin", slack, "dot segment"},
		{"https://a.example.com/x/../y", wild, "dot segment"},
		// Dots that are no segment of their own are a path like any other.
		{"https://hooks.slack.com/services/T0/B0/x.y..z", slack, ""},
		{"https://hooks.slack.com/services/...", slack, ""},
		{"https://hooks.slack.com/services/T0?next=../x", slack, ""},
	}
	for _, tt := range tests {
		err := CheckEndpoint(tt.url, tt.hosts, "SETTING")
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s refused: %v", tt.url, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want %q", tt.url, err, tt.want)
		case err != nil:
			u, _ := url.Parse(tt.url)
			if strings.Contains(err.Error(), u.EscapedPath()) && len(u.EscapedPath()) > 1 || strings.Contains(err.Error(), "secret") {
				t.Errorf("%s: the reason %q repeats the URL", tt.url, err)
			}
		}
	}
}
