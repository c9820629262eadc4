package netguard

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// Pattern is a host, and optionally a path prefix, that an endpoint of a
// channel must match: "hooks.slack.com/services/", "*.example.com" (any
// subdomain of example.com, not example.com itself), or "*" (any host).
// Ports are not part of a pattern: the Policy decides them.
type Pattern struct {
	Host       string // lower case, without a trailing dot; "*" or "*.domain" allowed
	PathPrefix string // "" or starting with "/"
}

func (p Pattern) String() string {
	if strings.Contains(p.Host, ":") {
		return "[" + p.Host + "]" + p.PathPrefix
	}
	return p.Host + p.PathPrefix
}

// ParsePatterns reads a comma-separated list of patterns. Empty items are
// ignored; an empty list is an error, since it would refuse every endpoint.
func ParsePatterns(s string) ([]Pattern, error) {
	var out []Pattern
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if strings.Contains(item, "://") {
			return nil, fmt.Errorf("%q: write a host and a path prefix, without a scheme (hooks.slack.com/services/)", item)
		}
		host, path := item, ""
		if i := strings.IndexByte(item, '/'); i >= 0 {
			host, path = item[:i], item[i:]
		}
		host = strings.ToLower(host)
		if host != "*." {
			host = strings.TrimSuffix(host, ".")
		}
		if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
			ip, err := netip.ParseAddr(host[1 : len(host)-1])
			if err != nil {
				return nil, fmt.Errorf("%q: %s is not an IPv6 address", item, host)
			}
			host = ip.String()
		} else if name := strings.TrimPrefix(host, "*."); host != "*" && (name == "" || strings.ContainsAny(name, "*:@?#[] \t")) {
			return nil, fmt.Errorf("%q is not a host, *.domain or *, optionally followed by a path prefix", item)
		}
		if strings.ContainsAny(path, "?# \t") {
			return nil, fmt.Errorf("%q: a path prefix has no query, fragment or space", item)
		}
		if hasDotSegment(path) {
			return nil, fmt.Errorf("%q: a path prefix has no . or .. segment", item)
		}
		out = append(out, Pattern{Host: host, PathPrefix: path})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no pattern in %q", s)
	}
	return out, nil
}

// Match reports whether u's host and path match p.
func (p Pattern) Match(u *url.URL) bool {
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	switch {
	case p.Host == "*":
	case strings.HasPrefix(p.Host, "*."):
		if !strings.HasSuffix(host, p.Host[1:]) {
			return false
		}
	case host != p.Host:
		return false
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	return strings.HasPrefix(path, p.PathPrefix)
}

// CheckEndpoint refuses an endpoint URL from a rule before anything is
// sent: it must be an absolute http or https URL without user info (which
// would become an Authorization header, and is a credential Klaxon would
// log and store), and, when hosts is not nil, match one of them and have
// no dot segment in its path. setting names the variable holding hosts,
// for the reason. Errors never repeat the URL; a refusal is an *Error.
//
// A server resolves "." and ".." before it routes, so
// "/services/../admin" starts with the prefix "/services/" and reaches
// "/admin". Such a URL is refused rather than normalised: what a server
// decodes before resolving differs ("%2e", "%2f", "\\", ";params"), and a
// URL sent as written is one the operator can read in the rule; no
// endpoint of Slack's, Loop's or the Telegram hook's has one.
func CheckEndpoint(raw string, hosts []Pattern, setting string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return &Error{Reason: "it is not an absolute http(s) URL"}
	}
	if u.User != nil {
		return &Error{Reason: "the URL holds a user name or password (user:pass@), which Klaxon does not send; " +
			"put a token in the path or query instead"}
	}
	if hosts == nil {
		return nil
	}
	if hasDotSegment(u.EscapedPath()) {
		return &Error{Reason: fmt.Sprintf("the URL's path has a dot segment (. or .., also as %%2e), "+
			"which could lead out of the path prefix of %s; write the path without it", setting)}
	}
	for _, p := range hosts {
		if p.Match(u) {
			return nil
		}
	}
	list := make([]string, len(hosts))
	for i, p := range hosts {
		list[i] = p.String()
	}
	return &Error{Reason: fmt.Sprintf("host %s with this path is not one of %s (%s)",
		u.Hostname(), strings.Join(list, ", "), setting)}
}

// hasDotSegment reports whether the escaped path has a "." or ".."
// segment as any server might read it: percent-decoded until nothing
// changes, at most four times (%2e, %252e), with "\\" and a decoded "%2f" splitting segments,
// and a ";params" suffix (which some servers drop) removed.
func hasDotSegment(path string) bool {
	for range 4 {
		decoded, err := url.PathUnescape(path)
		if err != nil || decoded == path {
			break
		}
		path = decoded
	}
	for seg := range strings.FieldsFuncSeq(path, func(r rune) bool { return r == '/' || r == '\\' }) {
		if i := strings.IndexByte(seg, ';'); i >= 0 {
			seg = seg[:i]
		}
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}
