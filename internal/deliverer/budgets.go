package deliverer

import (
	"cmp"
	"sync"
	"time"
)

// budgets keep any one host, address, project or channel from taking the
// sends that every project shares. A worker holds many delivery jobs at
// once (KLAXON_MAX_SENDS), each a goroutine: a hung request costs a
// goroutine and a socket, not the worker's attention. What bounds the
// harm of a host that accepts and never answers is how many sends to it,
// and to each thing it shares with others, may be in flight:
//
//   - a host (host:port of the endpoint, or the server a channel sends
//     through: the SMTP server, the Bot API), however many URLs or paths
//     name it;
//   - an address (the host's resolved IP), however many names and ports
//     point at it, four hosts' worth;
//   - a project, whatever hosts its rules name;
//   - a channel, half of all sends, so that one provider's outage leaves
//     the other channels their sends.
//
// A job over any of them is not sent: it goes back to the retry queues,
// spending no attempt, until its turn there (pool.reserve): the first
// for as long as that budget's oldest send in flight has lasted (at least
// 100 ms, at most the send timeout), each next one a send's length divided
// by the budget later, so that waiting jobs come back one by one as sends
// end instead of churning through the retry queues together.
//
// Each host also has a circuit that opens after consecutive timeouts: its
// jobs then wait out the circuit in the retry queues, costing a publish
// each, not a send. After openFor, one send probes; the circuit closes
// when it does not time out.
//
// State is this worker's own: each worker learns a host's timeouts for
// itself, which bounds what that host costs each of them.
type budgets struct {
	limits
	tripAfter int           // consecutive timeouts that open a circuit
	openFor   time.Duration // how long a circuit stays open before a probe
	probeFor  time.Duration // the longest a probe takes (the send timeout)

	mu    sync.Mutex
	hosts map[string]*host
	pools map[poolKey]*pool // addresses, projects and channels
}

// limits are the sends each kind of budget may have in flight.
type limits struct{ host, addr, project, channel int }

// A pool is the sends in flight of one budget, by when each started,
// oldest first, and the turns of the jobs put back while it was full.
type pool struct {
	inFlight []time.Time
	took     time.Duration // how long its sends take, a moving average
	turn     time.Time     // the last turn given to a job put back
}

// maxTurn bounds how far ahead a job put back is given its turn.
const maxTurn = 2 * time.Minute

// reserve gives a job that found p full, with limit sends in flight, its
// turn, and returns how long until it: the first waits as long as the
// oldest send has lasted (busyFor), each next one a send's length
// divided by limit later. So the jobs waiting come back one by one, at
// about the pace sends end, rather than all together, again and again.
func (p *pool) reserve(now time.Time, limit int, base time.Duration) time.Duration {
	step := max(cmp.Or(p.took, defaultTook)/time.Duration(limit), time.Millisecond)
	if first := now.Add(base); p.turn.Before(first) {
		p.turn = first
	}
	p.turn = p.turn.Add(step)
	if p.turn.Sub(now) > maxTurn {
		p.turn = now.Add(maxTurn)
	}
	return p.turn.Sub(now)
}

// defaultTook is what a send is taken to last before one has ended.
const defaultTook = 100 * time.Millisecond

// ended averages a send that lasted took into p's.
func (p *pool) ended(took time.Duration) {
	if p.took == 0 {
		p.took = took
		return
	}
	p.took = (4*p.took + took) / 5
}

func (p *pool) add(t time.Time) { p.inFlight = append(p.inFlight, t) }

func (p *pool) remove(t time.Time) {
	for i, s := range p.inFlight {
		if s.Equal(t) {
			p.inFlight = append(p.inFlight[:i], p.inFlight[i+1:]...)
			return
		}
	}
}

type poolKind uint8

const (
	byAddr poolKind = iota
	byProject
	byChannel
)

var poolNames = [...]string{byAddr: "address", byProject: "project", byChannel: "channel"}

type poolKey struct {
	kind poolKind
	name string
}

// host is a host's sends in flight and its circuit.
type host struct {
	pool
	state    circuitState
	timeouts int       // consecutive, while closed
	until    time.Time // open: when a probe may go; half-open: when the probe ends at the latest
	seen     time.Time // last send started or ended, to forget idle hosts
}

type circuitState int

const (
	closed circuitState = iota
	open
	halfOpen // one probe in flight
)

func (s circuitState) String() string {
	return [...]string{"closed", "open", "half_open"}[s]
}

// forgetAfter is how many hosts are kept before idle ones, with no send in
// flight and a closed circuit, are forgotten.
const forgetAfter = 4096

func newBudgets(l limits, tripAfter int, openFor, probeFor time.Duration) *budgets {
	return &budgets{
		limits: l, tripAfter: tripAfter, openFor: openFor, probeFor: probeFor,
		hosts: map[string]*host{}, pools: map[poolKey]*pool{},
	}
}

// target is where a send goes and whose it is: the budgets it spends.
// addr is "" when the host's address is not known.
type target struct{ host, addr, project, channel string }

func (t target) pools() [3]poolKey {
	return [...]poolKey{{byAddr, t.addr}, {byProject, t.project}, {byChannel, t.channel}}
}

// blocked reports how long a host's circuit keeps its jobs away, 0 when a
// job may try (the circuit is closed, or open long enough for a probe). It
// changes nothing: the caller asks before spending anything on the job,
// and enter decides.
func (b *budgets) blocked(hostKey string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.hosts[hostKey]
	if h == nil || h.state == closed || now.After(h.until) && h.state == open {
		return 0
	}
	return max(h.until.Sub(now), time.Millisecond)
}

// A verdict of enter.
type verdict struct {
	// slot is set when the job may send; give it back with leave.
	slot *slot
	// full names the budget that has every send it may have in flight
	// ("host", "address", "project", "channel"), "" when none: try again
	// after wait.
	full string
	// wait is how long to keep away: until a send may have ended (full),
	// or until the circuit lets a probe through.
	wait time.Duration
	// change is the circuit's new state when entering changed it (a probe
	// half-opens it), else "".
	change string
}

// slot is one send in flight.
type slot struct {
	target
	started time.Time
	probe   bool
}

// crowded reports which budget of t is full at now, "" when none is, and
// when it is, gives the job its turn there and how long until it: a job
// that would only be turned away is put back before it costs a claim in
// Redis.
func (b *budgets) crowded(t target, now time.Time) (string, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.full(b.hosts[t.host], t, now)
}

// full is crowded with mu held; h may be nil.
func (b *budgets) full(h *host, t target, now time.Time) (string, time.Duration) {
	if h != nil && len(h.inFlight) >= b.limits.host {
		return "host", h.reserve(now, b.limits.host, b.busyFor(h.inFlight[0], now))
	}
	bound := [...]int{byAddr: b.limits.addr, byProject: b.limits.project, byChannel: b.limits.channel}
	for _, k := range t.pools() {
		if k.name == "" {
			continue
		}
		if p := b.pools[k]; p != nil && len(p.inFlight) >= bound[k.kind] {
			return poolNames[k.kind], p.reserve(now, bound[k.kind], b.busyFor(p.inFlight[0], now))
		}
	}
	return "", 0
}

// enter asks for a send slot for t at now.
func (b *budgets) enter(t target, now time.Time) verdict {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.hosts[t.host]
	if h == nil {
		if len(b.hosts) >= forgetAfter {
			b.forget(now)
		}
		h = &host{}
		b.hosts[t.host] = h
	}
	if len(b.pools) >= 4*forgetAfter {
		b.forgetPools(now)
	}
	h.seen = now
	if h.state == halfOpen || h.state == open && now.Before(h.until) {
		return verdict{wait: max(h.until.Sub(now), time.Millisecond)}
	}
	if full, wait := b.full(h, t, now); full != "" {
		return verdict{full: full, wait: wait}
	}
	var v verdict
	sl := &slot{target: t, started: now}
	if h.state == open {
		sl.probe = true
		h.state, h.until = halfOpen, now.Add(b.probeFor)
		v.change = halfOpen.String()
	}
	h.add(now)
	for _, k := range t.pools() {
		if k.name == "" {
			continue
		}
		p := b.pools[k]
		if p == nil {
			p = &pool{}
			b.pools[k] = p
		}
		p.add(now)
	}
	v.slot = sl
	return v
}

// busyFor is how long a job waits for a budget whose oldest send in flight
// started at oldest: as long as that send has lasted, at least 100 ms, at
// most the send timeout. A budget whose sends are quick is tried again
// soon; one whose sends hang, later, so that its jobs do not churn through
// the retry queues while they wait.
func (b *budgets) busyFor(oldest, now time.Time) time.Duration {
	return min(max(now.Sub(oldest), 100*time.Millisecond), b.probeFor)
}

// What an endpoint did with a send, for the circuit.
type answer int

const (
	answered answer = iota // the endpoint answered (well or not)
	timedOut               // it did not answer in time
	unknown                // the send was cut short by the worker: says nothing of the endpoint
)

// leave gives a slot back with the send's outcome at now, and returns the
// circuit's new state when that changed it, else "".
func (b *budgets) leave(sl *slot, o answer, now time.Time) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	took := now.Sub(sl.started)
	for _, k := range sl.pools() {
		if p := b.pools[k]; p != nil {
			if p.remove(sl.started); len(p.inFlight) == 0 && !p.turn.After(now) {
				delete(b.pools, k)
			} else if o != unknown {
				p.ended(took)
			}
		}
	}
	h := b.hosts[sl.host]
	if h == nil {
		return ""
	}
	h.seen = now
	h.remove(sl.started)
	if o != unknown {
		h.ended(took)
	}
	switch {
	case sl.probe && o == answered:
		h.state, h.timeouts = closed, 0
		return closed.String()
	case sl.probe && o == timedOut:
		h.state, h.until = open, now.Add(b.openFor)
		return open.String()
	case sl.probe:
		h.state, h.until = open, now // let the next job probe
		return open.String()
	case h.state != closed || o == unknown:
		// A send that began before the circuit opened says nothing new.
	case o == answered:
		h.timeouts = 0
	case o == timedOut:
		if h.timeouts++; h.timeouts >= b.tripAfter {
			h.state, h.until, h.timeouts = open, now.Add(b.openFor), 0
			return open.String()
		}
	}
	return ""
}

// forgetPools drops pools with nothing in flight whose last turn has
// passed: those whose jobs put back never came again. Called with mu held.
func (b *budgets) forgetPools(now time.Time) {
	for k, p := range b.pools {
		if len(p.inFlight) == 0 && !p.turn.After(now) {
			delete(b.pools, k)
		}
	}
}

// forget drops hosts with nothing in flight whose circuit is closed and
// idle for openFor. Called with mu held.
func (b *budgets) forget(now time.Time) {
	for k, h := range b.hosts {
		if len(h.inFlight) == 0 && h.state == closed && now.Sub(h.seen) > b.openFor {
			delete(b.hosts, k)
		}
	}
}
