package deliverer

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/klaxonhq/klaxon/internal/wire"
)

// hoster is a channel that sends through a server of its own (the SMTP
// server, the Bot API) rather than to its endpoint: Host names it, "" when
// the endpoint is itself a URL whose host is the server.
type hoster interface {
	Host(endpoint string) string
}

// target is the budgets a send of job to endpoint spends.
func (d *Deliverer) target(ctx context.Context, job *wire.Job, endpoint string) target {
	var h string
	if c, ok := d.channels[job.Channel].(hoster); ok {
		h = c.Host(endpoint)
	}
	if h == "" {
		h = urlHost(endpoint)
	}
	if h == "" {
		// Not a URL and no server named: the channel's sends share one.
		h = job.Channel
	}
	return target{host: h, addr: d.addrs.lookup(ctx, h), project: job.ProjectID, channel: job.Channel}
}

// urlHost is the host:port an endpoint URL connects to, the port the
// scheme's own when it names none; "" when endpoint is not such a URL.
func urlHost(endpoint string) string {
	u, err := url.Parse(strings.TrimSpace(endpoint))
	if err != nil || u.Hostname() == "" {
		return ""
	}
	port := u.Port()
	if port == "" {
		switch strings.ToLower(u.Scheme) {
		case "http":
			port = "80"
		case "https":
			port = "443"
		default:
			return ""
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// endpointHost is what a log line may say of an endpoint: the host of a
// URL, "" for anything else (chat ids and addresses are personal data).
func endpointHost(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme == "" {
		return ""
	}
	return u.Hostname()
}

// addrs caches which address each host resolves to, so that many names
// and ports of one machine share its address budget. A lookup is bounded
// and its answer kept for a minute (a failure for ten seconds); a host
// that does not resolve has no address budget, only its own.
type addrs struct {
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	now     func() time.Time

	mu    sync.Mutex
	known map[string]resolved
}

type resolved struct {
	addr  string
	until time.Time
}

const (
	lookupTimeout  = time.Second
	resolvedFor    = time.Minute
	unresolvedFor  = 10 * time.Second
	addrsKeptAtMax = 4096
)

func newAddrs(r *net.Resolver, now func() time.Time) *addrs {
	return &addrs{
		resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return r.LookupNetIP(ctx, "ip", host)
		},
		now: now, known: map[string]resolved{},
	}
}

// lookup is the address hostport resolves to, "" when unknown.
func (a *addrs) lookup(ctx context.Context, hostport string) string {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return ""
	}
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return ip.Unmap().String()
	}
	now := a.now()
	a.mu.Lock()
	r, ok := a.known[host]
	a.mu.Unlock()
	if ok && now.Before(r.until) {
		return r.addr
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	ips, err := a.resolve(ctx, host)
	r = resolved{until: now.Add(unresolvedFor)}
	if err == nil && len(ips) > 0 {
		r = resolved{addr: ips[0].Unmap().String(), until: now.Add(resolvedFor)}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.known) >= addrsKeptAtMax {
		clear(a.known)
	}
	a.known[host] = r
	return r.addr
}
