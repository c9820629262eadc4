package counter

import (
	"cmp"
	"slices"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// Model is the counting semantics of observe.lua in plain Go: the readable
// specification, kept in memory and without expiry. Tests drive it and the
// Engine with the same events and require the same results.
type Model struct {
	state map[string]*modelState // by group and rule
	seen  map[string]Result      // first result by group and event ID
}

type modelState struct {
	clock   int64             // L: newest event time seen (ms)
	rearm   int64             // U: quiet until (ms)
	buckets []map[int64]int64 // per window: bucket index -> events
	users   map[string]int64  // user -> newest time seen (ms)
}

// NewModel returns an empty model.
func NewModel() *Model {
	return &Model{state: make(map[string]*modelState), seen: make(map[string]Result)}
}

// Observe counts ev at te, the time the engine counted it at (its clamped
// timestamp, or Redis' now), and returns what the engine must return.
func (m *Model) Observe(ev Event, te time.Time) Result {
	group := ev.ProjectID + "\x00" + ev.GroupHash
	if ev.ID != "" {
		if first, ok := m.seen[group+"\x00"+ev.ID]; ok {
			return replay(first)
		}
	}
	res := Result{Time: te, Outcomes: make([]Outcome, len(ev.Rules))}
	for i, r := range ev.Rules {
		key := group + "\x00" + r.ID + ":" + r.Version
		s := m.state[key]
		if s == nil {
			s = &modelState{buckets: make([]map[int64]int64, len(r.Windows)), users: make(map[string]int64)}
			for w := range s.buckets {
				s.buckets[w] = make(map[int64]int64)
			}
			m.state[key] = s
		}
		res.Outcomes[i] = s.observe(r, ev.UserID, te.UnixMilli())
		if o := &res.Outcomes[i]; o.Fired {
			o.ID = FiringID(ev.ProjectID, r.ID, ev.GroupHash, o.At)
		}
	}
	if ev.ID != "" {
		m.seen[group+"\x00"+ev.ID] = res
	}
	return res
}

func (s *modelState) observe(r *rules.Rule, user string, te int64) Outcome {
	o := Outcome{Rule: r, Window: -1, Counts: make([]int64, len(r.Windows))}
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
		for i, w := range r.Windows {
			b := Resolution(w.Period).Milliseconds()
			oldest := floorDiv(clock-w.Period.Milliseconds(), b)
			if idx := floorDiv(te, b); idx >= oldest {
				s.buckets[i][idx]++
			}
			for idx, n := range s.buckets[i] {
				if idx < oldest {
					delete(s.buckets[i], idx)
				} else {
					o.Counts[i] += n
				}
			}
		}
	}
	s.clock = clock
	if clock >= s.rearm {
		if len(r.Windows) == 0 {
			o.Fired = true
		}
		for i, w := range r.Windows {
			if o.Counts[i] >= w.Threshold {
				o.Fired, o.Window = true, i
				break
			}
		}
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

// replay is what a repeated event gets: its first result, but outcomes that
// did not fire then come back empty, unless one of them fired.
func replay(first Result) Result {
	r := Result{Time: first.Time, Duplicate: true, Outcomes: slices.Clone(first.Outcomes)}
	for _, o := range first.Outcomes {
		if o.Fired {
			return r
		}
	}
	for i, o := range r.Outcomes {
		r.Outcomes[i] = Outcome{Rule: o.Rule, Window: -1, Counts: []int64{}}
	}
	return r
}
