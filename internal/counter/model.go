package counter

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// Model is the counting semantics of observe.lua in plain Go: the readable
// specification, kept in memory and without expiry. Tests drive it and the
// Engine with the same events and require the same results.
//
//   - Rules with the same title filter count the same events, so each
//     (group, filter, period) has one ring of buckets, which every such
//     rule reads; each (group, rule) has its own clock and cooldown. A
//     spike window's baseline is a ring like any other, of its own period.
//   - An event with an ID counts once: a repeat gets the firings its first
//     delivery caused, and counts nothing. An event without an ID counts at
//     every delivery; a redelivered one also gets back the firings of the
//     last delivery of the same body that fired.
type Model struct {
	rings   map[string]*modelRing  // by group and ring tag
	states  map[string]*modelState // by group and rule state tag
	seen    map[string]bool        // by group and event key: IDs counted
	records map[string][]Outcome   // by group and event key: what it fired
}

type modelRing struct {
	clock   int64           // newest event time seen (ms)
	buckets map[int64]int64 // bucket index -> events
}

type modelState struct {
	clock int64            // L: newest event time seen (ms)
	rearm int64            // U: quiet until (ms)
	users map[string]int64 // user -> newest time seen (ms)
}

// NewModel returns an empty model.
func NewModel() *Model {
	return &Model{
		rings: make(map[string]*modelRing), states: make(map[string]*modelState),
		seen: make(map[string]bool), records: make(map[string][]Outcome),
	}
}

// Observe counts ev at te, the time the engine counted it at (its clamped
// timestamp, or Redis' now), and returns what a Verbose engine returns.
func (m *Model) Observe(ev Event, te time.Time) Result {
	group := ev.ProjectID + "\x00" + ev.GroupHash
	key, mode := eventKey(&ev)
	rk := group + "\x00" + key
	res := Result{Time: te, Outcomes: make([]Outcome, len(ev.Rules))}
	for i, r := range ev.Rules {
		res.Outcomes[i] = Outcome{Rule: r, Window: -1}
	}
	if mode == modeID && m.seen[rk] {
		res.Duplicate = true
		m.replay(&res, ev, m.records[rk])
		return res
	}
	m.seen[rk] = mode == modeID
	before := m.records[rk]
	t := te.UnixMilli()

	// Each ring counts the event once, however many rules read it.
	added := make(map[int64]bool)
	for _, r := range ev.Rules {
		if r.Users {
			continue
		}
		for _, p := range ringPeriods(r) {
			tag := ringTag(r, p)
			if !added[tag] {
				added[tag] = true
				m.ring(group, tag).add(t, p)
			}
		}
	}
	var fired []Outcome
	for i, r := range ev.Rules {
		o := m.state(group, r).observe(m, group, r, ev.UserID, t)
		if o.Fired {
			o.ID = FiringID(ev.ProjectID, r.ID, ev.GroupHash, o.At)
			fired = append(fired, o)
		}
		res.Outcomes[i] = o
	}
	if len(fired) > 0 {
		m.records[rk] = fired
	}
	if mode == modeRedelivered {
		m.replay(&res, ev, before)
	}
	return res
}

// replay gives each recorded firing to the event's rule of the same id,
// unless that rule fired now or has other windows today: other counts, or
// fewer windows than the one that fired.
func (m *Model) replay(res *Result, ev Event, record []Outcome) {
	for _, f := range record {
		k := ruleIndex(&ev, idTag(f.Rule))
		if k < 0 || res.Outcomes[k].Fired || len(f.Counts) != countsOf(ev.Rules[k]) || f.Window >= len(ev.Rules[k].Windows) {
			continue
		}
		f.Rule, f.Replayed = ev.Rules[k], true
		f.ID = FiringID(ev.ProjectID, f.Rule.ID, ev.GroupHash, f.At)
		res.Outcomes[k] = f
	}
}

func (m *Model) ring(group string, tag int64) *modelRing {
	k := group + "\x00" + strconv.FormatInt(tag, 10)
	r := m.rings[k]
	if r == nil {
		r = &modelRing{buckets: make(map[int64]int64)}
		m.rings[k] = r
	}
	return r
}

func (m *Model) state(group string, r *rules.Rule) *modelState {
	k := group + "\x00" + strconv.FormatInt(stateTag(r), 10)
	s := m.states[k]
	if s == nil {
		s = &modelState{users: make(map[string]int64)}
		m.states[k] = s
	}
	return s
}

// add counts an event at t: the window slides to end at the newest time
// seen, buckets before its start drop out, and the event counts in its
// bucket if that is still inside.
func (r *modelRing) add(t int64, period time.Duration) {
	b := Resolution(period).Milliseconds()
	r.clock = max(r.clock, t)
	oldest := floorDiv(r.clock-period.Milliseconds(), b)
	if idx := floorDiv(t, b); idx >= oldest {
		r.buckets[idx]++
	}
	for idx := range r.buckets {
		if idx < oldest {
			delete(r.buckets, idx)
		}
	}
}

func (r *modelRing) count() int64 {
	var n int64
	for _, c := range r.buckets {
		n += c
	}
	return n
}

func (s *modelState) observe(m *Model, group string, r *rules.Rule, user string, te int64) Outcome {
	o := Outcome{Rule: r, Window: -1, Counts: make([]int64, countsOf(r))}
	if r.Users && user == "" {
		// No user, nothing to count: the state as it is.
		for i, w := range r.Windows {
			if s.clock > 0 {
				o.Counts[i] = s.usersSince(s.clock - w.Period.Milliseconds())
			}
		}
		o.At, o.Rearm = unixMilli(s.clock), unixMilli(s.rearm)
		return o
	}
	clock := max(s.clock, te)
	if r.Users {
		longest := r.MaxPeriod().Milliseconds()
		if te > clock-longest {
			s.users[user] = max(s.users[user], te)
			s.trimUsers(clock-longest, maxThreshold(r))
		}
		for i, w := range r.Windows {
			o.Counts[i] = s.usersSince(clock - w.Period.Milliseconds())
		}
	} else {
		for i, p := range ringPeriods(r) {
			o.Counts[i] = m.ring(group, ringTag(r, p)).count()
		}
	}
	s.clock = clock
	if clock >= s.rearm {
		o.Window = firstReached(r, o.Counts)
		o.Fired = len(r.Windows) == 0 || o.Window >= 0
		if o.Fired {
			s.rearm = clock + max(r.Cooldown.Milliseconds(), 1)
		}
	}
	o.At, o.Rearm = unixMilli(s.clock), unixMilli(s.rearm)
	return o
}

// usersSince counts the users whose newest event is after t.
func (s *modelState) usersSince(t int64) int64 {
	var n int64
	for _, seen := range s.users {
		if seen > t {
			n++
		}
	}
	return n
}

// trimUsers forgets users not seen after oldest, then the least recently
// seen (ties by name, as Redis' ZPOPMIN) beyond limit: once limit users are
// in a window, the window has reached every threshold.
func (s *modelState) trimUsers(oldest, limit int64) {
	type seen struct {
		user string
		at   int64
	}
	var all []seen
	for u, at := range s.users {
		if at <= oldest {
			delete(s.users, u)
			continue
		}
		all = append(all, seen{u, at})
	}
	if int64(len(all)) <= limit {
		return
	}
	slices.SortFunc(all, func(a, b seen) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.user, b.user))
	})
	for _, x := range all[:int64(len(all))-limit] {
		delete(s.users, x.user)
	}
}

func maxThreshold(r *rules.Rule) int64 {
	var t int64
	for _, w := range r.Windows {
		t = max(t, w.Threshold)
	}
	return t
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
