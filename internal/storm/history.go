package storm

import (
	"maps"
	"slices"
)

// history is what a storm knows of the window that fired, built from looks
// at the window's ring of buckets (counter.Ring). A ring holds one period
// of buckets, ending at its newest event; looks at most a period apart
// therefore see every bucket, and with them the window's count at every
// moment between them: the count at t is the sum of the buckets from
// floor((t-period)/bucket) to floor(t/bucket), as the counter sums them
// (docs/contract.md §4.3). Times are Unix ms on Redis' clock.
type history struct {
	Period int64 `json:"period"`
	Bucket int64 `json:"bucket"`
	// Start is the first firing's time, Initial the window's count then.
	Start   int64 `json:"start"`
	Initial int64 `json:"initial"`
	// Look is when the ring was last read, 0 before the first look.
	Look int64 `json:"look"`
	// From is the first bucket whose count is known; Buckets are the
	// known buckets from it on that hold events.
	From    int64           `json:"from"`
	Buckets map[int64]int64 `json:"buckets"`
	// Loud is when the window last fell below its threshold (so far, or
	// as the buckets seen predict it will if no event comes).
	Loud int64 `json:"loud"`
	// Events and After are the events of buckets no longer kept: those
	// before Loud, and those after it (quiet, unless the storm comes back).
	Events int64 `json:"events"`
	After  int64 `json:"after"`
	// Inexact is set when a look came more than a period after the one
	// before (an outage): what happened in between is unseen, so Events
	// is a lower bound, and Loud is taken as the first moment seen again.
	Inexact bool `json:"inexact,omitempty"`
}

func newHistory(start, initial, period, bucket int64) *history {
	return &history{Period: period, Bucket: bucket, Start: start, Initial: initial, Loud: start, Buckets: map[int64]int64{}}
}

// observe folds a look at the ring into the history: now is Redis' clock,
// at the ring's clock (0 when the group has no live ring for the window:
// nothing counted for about a period), counts its buckets.
func (h *history) observe(now, at int64, counts map[int64]int64, threshold int64) {
	p, b := h.Period, h.Bucket
	if at <= 0 || at > now {
		at = now // no ring: every bucket of the last period is empty
	}
	// The ring knows every bucket from `from` to floor(at/b), and none
	// after it holds events up to now.
	from := floorDiv(at-p, b)
	switch {
	case h.Look == 0:
		lo, hi := floorDiv(h.Start-p, b), floorDiv(h.Start, b)
		h.From = lo
		if from > lo {
			// The ring moved on before the first look (events counted in
			// the same batch as the firing): what left it is the firing's
			// count less what the ring still holds of that window.
			var kept int64
			for i, c := range counts {
				if i <= hi {
					kept += c
				}
			}
			h.Events += max(0, h.Initial-kept)
			h.Inexact = h.Inexact || from > hi
			h.From = from
		}
	case from > floorDiv(h.Look, b)+1:
		// A gap: buckets between the looks were never seen. The storm is
		// taken as loud until the first moment seen again.
		h.retire(from)
		h.Inexact = true
		h.From = from
		h.raise(from*b + p)
	}
	h.Look = max(h.Look, now)
	for i, c := range counts {
		if i >= h.From && c > h.Buckets[i] {
			h.Buckets[i] = c
		}
	}
	h.evaluate(threshold)
	// No later window reaches below floor((now-period)/b).
	if keep := floorDiv(now-p, b); keep > h.From {
		h.retire(keep)
		h.From = keep
	}
}

// evaluate finds the end of the last stretch at or above the threshold
// among the moments whose whole window is known, and raises Loud to it.
// The count changes only when a bucket with events enters the window (at
// i*b) or leaves it (at (i+1)*b+period), so those moments are enough.
func (h *history) evaluate(threshold int64) {
	p, b := h.Period, h.Bucket
	t0 := h.From*b + p // the first moment whose window is known
	points := []int64{t0}
	for i := range h.Buckets {
		for _, t := range [...]int64{i * b, (i+1)*b + p} {
			if t > t0 {
				points = append(points, t)
			}
		}
	}
	slices.Sort(points)
	points = slices.Compact(points)
	idx := slices.Sorted(maps.Keys(h.Buckets))
	last := -1
	for k, t := range points {
		if h.count(idx, t) >= threshold {
			last = k
		}
	}
	// The last point has every bucket out of the window: a count of 0.
	if last >= 0 && last+1 < len(points) {
		h.raise(points[last+1])
	}
}

// count is the window's count at t over the sorted bucket indexes idx.
func (h *history) count(idx []int64, t int64) int64 {
	lo, hi := floorDiv(t-h.Period, h.Bucket), floorDiv(t, h.Bucket)
	var n int64
	for _, i := range idx {
		if i >= lo && i <= hi {
			n += h.Buckets[i]
		}
	}
	return n
}

// raise moves Loud later; the quiet events retired meanwhile were part
// of the storm after all.
func (h *history) raise(t int64) {
	if t > h.Loud {
		h.Loud = t
		h.Events += h.After
		h.After = 0
	}
}

// retire drops the buckets before index keep into Events or After.
func (h *history) retire(keep int64) {
	for i, c := range h.Buckets {
		if i >= keep {
			continue
		}
		if i*h.Bucket < h.Loud {
			h.Events += c
		} else {
			h.After += c
		}
		delete(h.Buckets, i)
	}
}

// over says whether the window has stayed below its threshold for a whole
// period by now.
func (h *history) over(now int64) bool { return h.Loud+h.Period <= now }

// events is the storm's events: from the first firing's window to Loud.
func (h *history) events() int64 {
	n := h.Events
	for i, c := range h.Buckets {
		if i*h.Bucket < h.Loud {
			n += c
		}
	}
	return n
}

// next is when to look again: when the window will have been quiet for
// a period if no event comes, and at most half a period after now, so
// that looks stay less than a period apart and see every bucket.
func (h *history) next(now int64) int64 {
	return max(min(h.Loud+h.Period, now+h.Period/2), now+1)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
