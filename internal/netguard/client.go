package netguard

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// ClientOptions tune the client of Policy.Client. Zero values take the
// defaults shown.
type ClientOptions struct {
	// Timeout bounds a whole request [none: deadlines come from contexts].
	Timeout time.Duration
	// MaxIdleConnsPerHost is how many idle connections are kept per host
	// [net/http's 2].
	MaxIdleConnsPerHost int
	// Resolver looks names up [net.DefaultResolver]. Tests give one that
	// answers from a local DNS server.
	Resolver *net.Resolver
}

// Client returns an HTTP client for endpoints that come from rules: every
// connection is checked against p once its address is known, redirects are
// not followed (the 3xx response is returned), and no proxy is used.
func (p Policy) Client(o ClientOptions) *http.Client {
	dialer := &net.Dialer{
		Timeout:   30 * time.Second,
		KeepAlive: 30 * time.Second,
		Resolver:  o.Resolver,
		// Control runs for each address the dialer tries, after the name
		// was resolved and before the connection is made.
		ControlContext: p.control,
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = dialer.DialContext
	if o.MaxIdleConnsPerHost > 0 {
		t.MaxIdleConnsPerHost = o.MaxIdleConnsPerHost
	}
	return &http.Client{
		Transport:     t,
		Timeout:       o.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// control is the dialer's Control hook: address is the IP and port the
// socket is about to connect to.
func (p Policy) control(_ context.Context, network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		// Not an IP address: a network this check does not understand.
		return &Error{Reason: fmt.Sprintf("cannot check the address %q (%s)", address, network)}
	}
	return p.Check(ap)
}
