package deliverer

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// Each budget bounds its own sends in flight: a host however many paths
// name it, an address however many hosts point at it, a project whatever
// hosts it names, a channel whatever projects use it. Others' sends still
// get theirs, and a job turned away waits as long as the full budget's
// oldest send has lasted.
func TestSendsInFlightBoundedPerHostAddressProjectAndChannel(t *testing.T) {
	b := newBudgets(limits{host: 2, addr: 3, project: 4, channel: 6}, 5, time.Minute, 10*time.Second)
	now := time.Now()
	enter := func(host, addr, project, channel string) verdict {
		t.Helper()
		return b.enter(target{host: host, addr: addr, project: project, channel: channel}, now)
	}
	var slots []*slot
	for range 2 {
		v := enter("hung:80", "10.0.0.1", "p1", "webhook")
		if v.slot == nil {
			t.Fatalf("a send within the host's bound refused: %+v", v)
		}
		slots = append(slots, v.slot)
	}
	now = now.Add(400 * time.Millisecond)
	// Its turn: as long as the oldest send has lasted, and a send's length
	// (100 ms before any ended) shared by the host's 2 sends.
	if v := enter("hung:80", "10.0.0.1", "p2", "webhook"); v.full != "host" || v.wait != 450*time.Millisecond {
		t.Errorf("a third send to a host with two in flight for 400ms: %+v, want the host full, its turn in 450ms", v)
	}
	if full, wait := b.crowded(target{host: "hung:80", project: "p9", channel: "slack"}, now); full != "host" || wait != 500*time.Millisecond {
		t.Errorf("crowded = %q %v, want the host full, the next turn in 500ms", full, wait)
	}
	if v := enter("hung:8080", "10.0.0.1", "p2", "webhook"); v.slot == nil {
		t.Errorf("another port of the address refused: %+v", v)
	}
	if v := enter("other-name:80", "10.0.0.1", "p2", "webhook"); v.full != "address" {
		t.Errorf("a fourth send to one address: %+v, want the address full", v)
	}
	if v := enter("a:80", "10.0.0.2", "p1", "webhook"); v.slot == nil {
		t.Errorf("project p1's third send, to another host, refused: %+v", v)
	}
	if v := enter("b:80", "10.0.0.3", "p1", "webhook"); v.slot == nil {
		t.Errorf("project p1's fourth send refused: %+v", v)
	}
	if v := enter("c:80", "10.0.0.4", "p1", "email"); v.full != "project" {
		t.Errorf("project p1's fifth send in flight: %+v, want the project full", v)
	}
	if v := enter("d:80", "", "p3", "webhook"); v.slot == nil {
		t.Errorf("a sixth webhook send, of another project, refused: %+v", v)
	}
	if v := enter("e:80", "", "p4", "webhook"); v.full != "channel" {
		t.Errorf("a seventh webhook send: %+v, want the channel full", v)
	}
	if v := enter("e:80", "", "p4", "slack"); v.slot == nil {
		t.Errorf("another channel's send refused: %+v", v)
	}
	b.leave(slots[0], answered, now)
	if v := enter("hung:80", "10.0.0.9", "p3", "slack"); v.slot == nil {
		t.Errorf("a send refused after one of the host's ended: %+v", v)
	}
	if len(b.pools) == 0 {
		t.Fatal("no pools kept while sends are in flight")
	}
}

// Jobs put back while a budget is full come back one by one, at about the
// pace its sends end, not all at once: each gets a turn a send's length
// divided by the budget after the one before, up to maxTurn ahead.
func TestJobsPutBackGetTurnsOneByOne(t *testing.T) {
	b := newBudgets(limits{host: 4, addr: 64, project: 64, channel: 64}, 5, time.Minute, 10*time.Second)
	now := time.Now()
	h := target{host: "slow:80", project: "p", channel: "webhook"}
	for range 4 {
		v := b.enter(h, now)
		if v.slot == nil {
			t.Fatalf("send refused: %+v", v)
		}
		// Each lasts 2 s: the host's sends take 2 s.
		b.leave(v.slot, answered, now.Add(2*time.Second))
		if v = b.enter(h, now); v.slot == nil {
			t.Fatalf("send refused: %+v", v)
		}
	}
	var last time.Duration
	for i := range 10 {
		_, wait := b.crowded(h, now)
		// The first as long as the oldest send has lasted (100 ms: it
		// just started), then 2 s / 4 = 500 ms apart.
		if want := 100*time.Millisecond + time.Duration(i+1)*500*time.Millisecond; wait != want {
			t.Fatalf("job %d put back for %v, want %v", i, wait, want)
		}
		last = wait
	}
	for range 1000 {
		_, last = b.crowded(h, now)
	}
	if last != maxTurn {
		t.Errorf("the 1,010th job put back for %v, want at most %v", last, maxTurn)
	}
}

// A budget forgets what it no longer holds: a pool with nothing in flight
// is removed, so that many projects and addresses cost nothing once quiet.
func TestEmptyPoolsAreForgotten(t *testing.T) {
	b := newBudgets(limits{host: 2, addr: 8, project: 4, channel: 6}, 5, time.Minute, 10*time.Second)
	now := time.Now()
	v := b.enter(target{host: "h:80", addr: "10.0.0.1", project: "p", channel: "webhook"}, now)
	if v.slot == nil {
		t.Fatalf("send refused: %+v", v)
	}
	b.leave(v.slot, answered, now)
	if len(b.pools) != 0 {
		t.Errorf("%d pools kept with nothing in flight", len(b.pools))
	}
	// A pool that gave a turn to a job that never came back goes too, once
	// its turn has passed and enough pools are kept.
	var slots []*slot
	for i := range 4 {
		slots = append(slots, b.enter(target{host: fmt.Sprintf("h%d:80", i), project: "p", channel: "webhook"}, now).slot)
	}
	if why, _ := b.crowded(target{host: "h9:80", project: "p", channel: "webhook"}, now); why != "project" {
		t.Fatalf("crowded = %q, want the project full", why)
	}
	for _, sl := range slots {
		b.leave(sl, answered, now)
	}
	if _, kept := b.pools[poolKey{byProject, "p"}]; !kept {
		t.Fatal("a pool with a turn ahead dropped at once")
	}
	later := now.Add(maxTurn)
	for i := range 4 * forgetAfter {
		b.pools[poolKey{byAddr, fmt.Sprint(i)}] = &pool{}
	}
	b.enter(target{host: "other:80", project: "q", channel: "slack"}, later)
	if _, kept := b.pools[poolKey{byProject, "p"}]; kept || len(b.pools) > 3 {
		t.Errorf("%d pools kept past %d, the idle project's among them: %v", len(b.pools), 4*forgetAfter, kept)
	}
}

// Consecutive timeouts open the circuit; it keeps jobs away for openFor,
// then lets one probe through, and closes when the probe is answered or
// opens again when it times out. Each change is reported once.
func TestCircuitOpensOnTimeoutsAndProbes(t *testing.T) {
	s := newBudgets(limits{host: 8, addr: 32, project: 64, channel: 64}, 3, 30*time.Second, 10*time.Second)
	now := time.Now()
	x := target{host: "x:443", project: "p", channel: "slack"}
	send := func(o answer) string {
		t.Helper()
		v := s.enter(x, now)
		if v.slot == nil {
			t.Fatalf("send refused: %+v", v)
		}
		return s.leave(v.slot, o, now)
	}
	send(timedOut)
	send(answered) // an answer resets the count
	send(timedOut)
	if c := send(timedOut); c != "" {
		t.Fatalf("circuit changed to %q after two timeouts in a row", c)
	}
	if c := send(timedOut); c != "open" {
		t.Fatalf("after three timeouts in a row the circuit is %q, want open", c)
	}
	if w := s.blocked("x:443", now); w != 30*time.Second {
		t.Errorf("blocked for %v, want 30s", w)
	}
	if v := s.enter(x, now.Add(time.Second)); v.slot != nil || v.full != "" || v.wait != 29*time.Second {
		t.Errorf("a send while open: %+v, want kept away 29s", v)
	}
	if w := s.blocked("other", now); w != 0 {
		t.Errorf("another destination blocked for %v", w)
	}

	now = now.Add(31 * time.Second)
	if w := s.blocked("x:443", now); w != 0 {
		t.Errorf("blocked for %v once the circuit may probe", w)
	}
	probe := s.enter(x, now)
	if probe.slot == nil || probe.change != "half_open" {
		t.Fatalf("the first send after openFor: %+v, want a probe half-opening the circuit", probe)
	}
	if v := s.enter(x, now); v.slot != nil || v.wait != 10*time.Second {
		t.Errorf("a second send during the probe: %+v, want kept away for the probe's 10s", v)
	}
	if c := s.leave(probe.slot, timedOut, now); c != "open" {
		t.Fatalf("a probe timing out left the circuit %q, want open", c)
	}
	now = now.Add(31 * time.Second)
	probe = s.enter(x, now)
	if c := s.leave(probe.slot, answered, now); c != "closed" {
		t.Fatalf("an answered probe left the circuit %q, want closed", c)
	}
	if v := s.enter(x, now); v.slot == nil || v.change != "" {
		t.Errorf("a send after the circuit closed: %+v", v)
	}
}

func TestEndpointHostNeverTheURL(t *testing.T) {
	for endpoint, want := range map[string]string{
		"https://hooks.slack.com/services/T0/B0/secret": "hooks.slack.com",
		"ops@example.com":   "",
		"-1001234567":       "",
		"https://u@x:8443/": "x",
	} {
		if got := endpointHost(endpoint); got != want {
			t.Errorf("endpointHost(%q) = %q, want %q", endpoint, got, want)
		}
	}
}

// A host is the host:port a send connects to: every path and user of a URL
// names the same one, and a port left out is the scheme's.
func TestURLHost(t *testing.T) {
	for endpoint, want := range map[string]string{
		"https://hooks.slack.com/services/T0/B0/secret": "hooks.slack.com:443",
		"http://Hung.Example:80/a":                      "hung.example:80",
		"http://hung.example/b?x=1":                     "hung.example:80",
		"https://u:p@x:8443/":                           "x:8443",
		"http://[::1]:9000/hook":                        "[::1]:9000",
		"ops@example.com":                               "",
		"-1001234567":                                   "",
		"ftp://x/":                                      "",
	} {
		if got := urlHost(endpoint); got != want {
			t.Errorf("urlHost(%q) = %q, want %q", endpoint, got, want)
		}
	}
}

// Names of one machine share its address: a literal IP is its own, a name
// is looked up once and remembered, and one that does not resolve has none.
func TestAddressesOfHosts(t *testing.T) {
	lookups := 0
	now := time.Now()
	a := &addrs{now: func() time.Time { return now }, known: map[string]resolved{},
		resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			lookups++
			if host == "nowhere.example" {
				return nil, errors.New("no such host")
			}
			return []netip.Addr{netip.MustParseAddr("::ffff:127.0.0.1")}, nil
		}}
	ctx := context.Background()
	for hostport, want := range map[string]string{
		"127.0.0.1:9000":       "127.0.0.1",
		"[::1]:80":             "::1",
		"localhost:9000":       "127.0.0.1",
		"nowhere.example:80":   "",
		"no-port-at-all":       "",
		"LOCALHOST.example:81": "127.0.0.1",
	} {
		if got := a.lookup(ctx, hostport); got != want {
			t.Errorf("lookup(%q) = %q, want %q", hostport, got, want)
		}
	}
	before := lookups
	if got := a.lookup(ctx, "localhost:9001"); got != "127.0.0.1" || lookups != before {
		t.Errorf("a known host looked up again (%d lookups, %q)", lookups-before, got)
	}
	now = now.Add(2 * resolvedFor)
	a.lookup(ctx, "localhost:9001")
	if lookups != before+1 {
		t.Errorf("a host's address kept past %s", resolvedFor)
	}
}
