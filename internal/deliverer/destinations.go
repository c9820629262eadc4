package deliverer

import (
	"encoding/hex"
	"net/url"
	"sync"
	"time"
)

// destinations keeps one project or one destination from taking the sends
// that every project shares: a worker sends up to 64 jobs at once, and an
// endpoint that never answers would otherwise hold every one of them for
// the send timeout. It bounds the sends in flight per destination (a
// channel and an endpoint) and per project, and keeps a circuit per
// destination that opens after consecutive timeouts: the destination's jobs
// then wait out the circuit in the retry queues, costing a publish each,
// instead of a send slot for the timeout. After openFor, one send probes;
// the circuit closes when it does not time out.
//
// State is this worker's own: each worker learns a destination's timeouts
// for itself, which bounds what that destination costs each of them.
type destinations struct {
	perDestination, perProject int
	tripAfter                  int           // consecutive timeouts that open a circuit
	openFor                    time.Duration // how long a circuit stays open before a probe
	probeFor                   time.Duration // the longest a probe takes (the send timeout)

	mu       sync.Mutex
	dests    map[string]*destination
	projects map[string]int // sends in flight by project
}

type destination struct {
	inFlight []time.Time // when each send in flight started
	state    circuitState
	timeouts int       // consecutive, while closed
	until    time.Time // open: when a probe may go; half-open: when the probe ends at the latest
	seen     time.Time // last send started or ended, to forget idle destinations
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

// forgetAfter is how many destinations are kept before idle ones, with no
// send in flight and a closed circuit, are forgotten.
const forgetAfter = 4096

func newDestinations(perDestination, perProject, tripAfter int, openFor, probeFor time.Duration) *destinations {
	return &destinations{
		perDestination: perDestination, perProject: perProject, tripAfter: tripAfter,
		openFor: openFor, probeFor: probeFor,
		dests: map[string]*destination{}, projects: map[string]int{},
	}
}

// destinationKey names a job's destination without its endpoint, which may
// be a secret (a Slack webhook URL, an address): the channel and its tag
// (seal.Keys.Tag: keyed when KLAXON_ENDPOINT_KEY is set).
func destinationKey(channel string, tag []byte) string {
	return channel + ":" + hex.EncodeToString(tag[:12])
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

// blocked reports how long a destination's circuit keeps its jobs away, 0
// when a job may try (the circuit is closed, or open long enough for a
// probe). It changes nothing: the caller asks before spending anything on
// the job, and enter decides.
func (s *destinations) blocked(dest string, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dests[dest]
	if d == nil || d.state == closed || now.After(d.until) && d.state == open {
		return 0
	}
	return max(d.until.Sub(now), time.Millisecond)
}

// A verdict of enter.
type verdict struct {
	// slot is set when the job may send; give it back with leave.
	slot *slot
	// busy is set when the destination or the project has every send it
	// may have in flight: try again after wait.
	busy bool
	// wait is how long to keep away: until a send may have ended (busy),
	// or until the circuit lets a probe through.
	wait time.Duration
	// change is the circuit's new state when entering changed it (a probe
	// half-opens it), else "".
	change string
}

// slot is one send in flight.
type slot struct {
	dest, project string
	started       time.Time
	probe         bool
}

// enter asks for a send slot for a job of project to dest at now.
func (s *destinations) enter(dest, project string, now time.Time) verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dests[dest]
	if d == nil {
		if len(s.dests) >= forgetAfter {
			s.forget(now)
		}
		d = &destination{}
		s.dests[dest] = d
	}
	d.seen = now
	var v verdict
	switch {
	case d.state == halfOpen || d.state == open && now.Before(d.until):
		return verdict{wait: max(d.until.Sub(now), time.Millisecond)}
	case len(d.inFlight) >= s.perDestination:
		v = verdict{busy: true, wait: s.busyFor(d.inFlight[0], now)}
	case s.projects[project] >= s.perProject:
		v = verdict{busy: true, wait: s.busyFor(now, now)}
	}
	if v.busy {
		return v
	}
	sl := &slot{dest: dest, project: project, started: now}
	if d.state == open {
		sl.probe = true
		d.state, d.until = halfOpen, now.Add(s.probeFor)
		v.change = halfOpen.String()
	}
	d.inFlight = append(d.inFlight, now)
	s.projects[project]++
	v.slot = sl
	return v
}

// busyFor is how long a job waits for a destination whose oldest send in
// flight started at oldest: as long as that send has lasted, at least
// 100 ms, at most the send timeout. A destination that answers fast is
// tried again soon; one whose sends hang, later, so that its jobs do not
// churn through the retry queue while they wait.
func (s *destinations) busyFor(oldest, now time.Time) time.Duration {
	return min(max(now.Sub(oldest), 100*time.Millisecond), s.probeFor)
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
func (s *destinations) leave(sl *slot, o answer, now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.projects[sl.project]--; s.projects[sl.project] <= 0 {
		delete(s.projects, sl.project)
	}
	d := s.dests[sl.dest]
	if d == nil {
		return ""
	}
	d.seen = now
	for i, t := range d.inFlight {
		if t.Equal(sl.started) {
			d.inFlight = append(d.inFlight[:i], d.inFlight[i+1:]...)
			break
		}
	}
	switch {
	case sl.probe && o == answered:
		d.state, d.timeouts = closed, 0
		return closed.String()
	case sl.probe && o == timedOut:
		d.state, d.until = open, now.Add(s.openFor)
		return open.String()
	case sl.probe:
		d.state, d.until = open, now // let the next job probe
		return open.String()
	case d.state != closed || o == unknown:
		// A send that began before the circuit opened says nothing new.
	case o == answered:
		d.timeouts = 0
	case o == timedOut:
		if d.timeouts++; d.timeouts >= s.tripAfter {
			d.state, d.until, d.timeouts = open, now.Add(s.openFor), 0
			return open.String()
		}
	}
	return ""
}

// forget drops destinations with nothing in flight whose circuit is closed
// and idle for openFor. Called with mu held.
func (s *destinations) forget(now time.Time) {
	for k, d := range s.dests {
		if len(d.inFlight) == 0 && d.state == closed && now.Sub(d.seen) > s.openFor {
			delete(s.dests, k)
		}
	}
}
