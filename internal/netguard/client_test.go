package netguard

import (
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// server is a local HTTP server standing for something inside: it counts
// the requests that reach it.
func server(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if h != nil {
			h(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func post(t *testing.T, c *http.Client, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	return resp, err
}

// A send to 127.0.0.1 reaches nothing without the operator's opt-in, and is
// delivered with it.
func TestClientRefusesLoopbackUnlessAllowed(t *testing.T) {
	srv, hits := server(t, nil)
	_, err := post(t, Policy{}.Client(ClientOptions{}), srv.URL+"/hook")
	if !IsRefused(err) || !strings.Contains(err.Error(), "127.0.0.1, a loopback address") {
		t.Errorf("without the allowlist: %v", err)
	}
	if hits.Load() != 0 {
		t.Fatalf("the server got %d requests", hits.Load())
	}
	resp, err := post(t, Policy{Allow: loopback}.Client(ClientOptions{}), srv.URL+"/hook")
	if err != nil || resp.StatusCode != http.StatusOK || hits.Load() != 1 {
		t.Errorf("with the allowlist: %v, %d requests", err, hits.Load())
	}
}

// A name is checked by the address it resolves to, when the connection is
// made: "localhost", and a public-looking name whose DNS answers 127.0.0.1
// (what a rebinding attack does between a check and the send).
func TestClientChecksResolvedNames(t *testing.T) {
	srv, hits := server(t, nil)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	resolver := fakeDNS(t, map[string]netip.Addr{"hooks.example.com.": netip.MustParseAddr("127.0.0.1")})

	refusing := Policy{}.Client(ClientOptions{Resolver: resolver})
	for _, host := range []string{"localhost", "hooks.example.com"} {
		_, err := post(t, refusing, "http://"+net.JoinHostPort(host, itoa(port))+"/hook")
		if !IsRefused(err) || !strings.Contains(err.Error(), "loopback address") {
			t.Errorf("%s: %v", host, err)
		}
	}
	if hits.Load() != 0 {
		t.Fatalf("the server got %d requests", hits.Load())
	}
	// The same name, allowed: the fake DNS really was what the dialer used.
	resp, err := post(t, Policy{Allow: loopback}.Client(ClientOptions{Resolver: resolver}),
		"http://hooks.example.com:"+itoa(port)+"/hook")
	if err != nil || resp.StatusCode != http.StatusOK || hits.Load() != 1 {
		t.Errorf("allowed: %v, %d requests", err, hits.Load())
	}
}

// A 307 or 308 would repeat the POST, body and all, to wherever the
// endpoint points: a public URL could send it inside. The client returns
// the 3xx instead.
func TestClientDoesNotFollowRedirects(t *testing.T) {
	inside, insideHits := server(t, nil)
	for _, code := range []int{301, 302, 303, 307, 308} {
		outside, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, inside.URL+"/secret", code)
		})
		resp, err := post(t, Policy{Allow: loopback}.Client(ClientOptions{}), outside.URL+"/hook")
		if err != nil || resp.StatusCode != code {
			t.Errorf("%d: %v, %v", code, resp, err)
		}
	}
	if insideHits.Load() != 0 {
		t.Errorf("the redirect target got %d requests", insideHits.Load())
	}
}

// HTTP_PROXY and friends would have a proxy make the connection, and the
// check see only the proxy's address.
func TestClientUsesNoProxy(t *testing.T) {
	c := Policy{}.Client(ClientOptions{})
	if tr := c.Transport.(*http.Transport); tr.Proxy != nil {
		t.Error("the transport takes a proxy")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// fakeDNS starts a DNS server on 127.0.0.1 answering A queries for names
// (fully qualified) and nothing else, and returns a resolver that asks it.
func fakeDNS(t *testing.T, names map[string]netip.Addr) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if reply, ok := dnsReply(buf[:n], names); ok {
				pc.WriteTo(reply, from)
			}
		}
	}()
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "udp", pc.LocalAddr().String())
		},
	}
}

// dnsReply answers one query (RFC 1035 §4): the header and question copied,
// one A record when the name is known and the type is A, NXDOMAIN when the
// name is unknown.
func dnsReply(q []byte, names map[string]netip.Addr) ([]byte, bool) {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return nil, false
	}
	var name strings.Builder
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if i+1+l > len(q) {
			return nil, false
		}
		name.WriteString(strings.ToLower(string(q[i+1:i+1+l])) + ".")
		i += 1 + l
	}
	if i+5 > len(q) {
		return nil, false
	}
	end := i + 5 // the zero label, QTYPE, QCLASS
	qtype := binary.BigEndian.Uint16(q[i+1 : i+3])
	addr, known := names[name.String()]
	r := append([]byte(nil), q[:end]...)
	flags := uint16(0x8180) // response, recursion desired and available
	if !known {
		flags |= 3 // NXDOMAIN
	}
	binary.BigEndian.PutUint16(r[2:4], flags)
	binary.BigEndian.PutUint16(r[8:10], 0)  // no authority
	binary.BigEndian.PutUint16(r[10:12], 0) // no additional (the query's EDNS0 is dropped)
	if known && qtype == 1 && addr.Is4() {
		binary.BigEndian.PutUint16(r[6:8], 1)
		a := addr.As4()
		r = append(r, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
		r = append(r, a[:]...)
	} else {
		binary.BigEndian.PutUint16(r[6:8], 0)
	}
	return r, true
}
