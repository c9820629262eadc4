package deliverer

import (
	"sync"
	"time"
)

// refusals remembers which (project, rule, channel)s had a refused endpoint
// logged lately: a rule whose webhook points inside fails every firing,
// and one line an hour says so as well as a thousand. Bounded: when full,
// entries past their hour go, and if none has, all do (the next refusals
// are logged again, which costs lines, not correctness).
type refusals struct {
	mu    sync.Mutex
	seen  map[string]time.Time // key → when it was last logged
	every time.Duration
	max   int
}

func newRefusals() *refusals {
	return &refusals{seen: map[string]time.Time{}, every: time.Hour, max: 4096}
}

// first reports whether the refusal of key should be logged at now, and
// if so remembers it.
func (r *refusals) first(key string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if at, ok := r.seen[key]; ok && now.Sub(at) < r.every {
		return false
	}
	if len(r.seen) >= r.max {
		for k, at := range r.seen {
			if now.Sub(at) >= r.every {
				delete(r.seen, k)
			}
		}
		if len(r.seen) >= r.max {
			clear(r.seen)
		}
	}
	r.seen[key] = now
	return true
}
