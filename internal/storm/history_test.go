package storm

import "testing"

// ring is what the counter's ring holds at now for events at times ts
// (ms) of a window of period p in buckets of b: the buckets of the window
// ending at the newest event, and nothing once the ring expired.
func ring(ts []int64, now, p, b int64) (int64, map[int64]int64) {
	var at int64
	for _, t := range ts {
		if t <= now {
			at = max(at, t)
		}
	}
	counts := map[int64]int64{}
	if at == 0 || at+p+b+1000 <= now {
		return 0, counts
	}
	for _, t := range ts {
		if t <= at && floorDiv(t, b) >= floorDiv(at-p, b) {
			counts[floorDiv(t, b)]++
		}
	}
	return at, counts
}

func burst(from, n, step int64) []int64 {
	var ts []int64
	for i := range n {
		ts = append(ts, from+i*step)
	}
	return ts
}

// follow starts a storm at firing time start with count initial, looks at
// the ring at first, then every step ms, and returns the history when it
// is over and the time it was found over.
func follow(t *testing.T, ts []int64, start, initial, first, step, threshold int64) (*history, int64) {
	t.Helper()
	const p, b = 1000, 100
	h := newHistory(start, initial, p, b)
	for now := first; now < first+60_000; now += step {
		at, counts := ring(ts, now, p, b)
		h.observe(now, at, counts, threshold)
		if h.over(now) {
			return h, now
		}
	}
	t.Fatal("the storm never ended")
	return nil, 0
}

func TestStormEndsAPeriodAfterTheWindowFellBelow(t *testing.T) {
	ts := burst(10_000, 6, 100) // 6 events, one a bucket; 5 in 1 s fires at 10,400
	h, at := follow(t, ts, 10_400, 5, 10_400, 100, 5)
	// Bucket 100 leaves the window at 11,100 (5 left), bucket 101 at 11,200.
	if h.Loud != 11_200 || at != 12_200 || h.events() != 6 || h.Inexact {
		t.Fatalf("quiet since %d, over at %d, %d events, inexact %t; want 11200, 12200, 6, false", h.Loud, at, h.events(), h.Inexact)
	}
}

func TestStormThatComesBackWithinAPeriodIsOneStorm(t *testing.T) {
	// A falls below at 11,100; B reaches the threshold again at 11,900,
	// before a full quiet period (12,100), and falls below at 12,600.
	ts := append(burst(10_000, 5, 100), burst(11_500, 5, 100)...)
	h, at := follow(t, ts, 10_400, 5, 10_400, 100, 5)
	if h.Loud != 12_600 || at != 13_600 || h.events() != 10 {
		t.Fatalf("quiet since %d, over at %d, %d events; want 12600, 13600, 10", h.Loud, at, h.events())
	}
}

func TestStormQuietForAPeriodEndsBeforeTheNextBurst(t *testing.T) {
	// B reaches the threshold at 12,400: after 12,100.
	ts := append(burst(10_000, 5, 100), burst(12_000, 5, 100)...)
	h, at := follow(t, ts, 10_400, 5, 10_400, 100, 5)
	if h.Loud != 11_100 || at != 12_100 || h.events() != 5 {
		t.Fatalf("quiet since %d, over at %d, %d events; want 11100, 12100, 5", h.Loud, at, h.events())
	}
}

func TestStormCountsWhatLeftTheRingBeforeTheFirstLook(t *testing.T) {
	// The same batch counted more events after the firing: the ring has
	// moved on when the storm first looks.
	ts := burst(10_000, 14, 100)
	h, _ := follow(t, ts, 10_400, 5, 11_300, 100, 5)
	if h.events() != 14 || h.Inexact {
		t.Fatalf("%d events, inexact %t; want 14, false", h.events(), h.Inexact)
	}
}

func TestStormLongerThanItsRingCountsEveryEvent(t *testing.T) {
	ts := burst(10_000, 200, 50) // 10 s of 20 a second
	h, _ := follow(t, ts, 10_200, 5, 10_200, 300, 5)
	if h.events() != 200 || h.Inexact {
		t.Fatalf("%d events, inexact %t; want 200, false", h.events(), h.Inexact)
	}
	// The last events, at 19,950: bucket 195 and 199 leave by 21,000.
	if h.Loud <= 19_950 || h.Loud > 21_000 {
		t.Fatalf("quiet since %d", h.Loud)
	}
	if len(h.Buckets) > 2*int(h.Period/h.Bucket)+2 {
		t.Fatalf("%d buckets kept: more than two periods", len(h.Buckets))
	}
}

func TestStormAfterAnOutageIsALowerBound(t *testing.T) {
	const p, b = 1000, 100
	ts := append(burst(10_000, 5, 100), burst(15_000, 5, 100)...)
	h := newHistory(10_400, 5, p, b)
	at, counts := ring(ts, 10_400, p, b)
	h.observe(10_400, at, counts, 5)
	// Every worker down until 20,000: the second burst is never seen.
	for now := int64(20_000); ; now += 100 {
		at, counts := ring(ts, now, p, b)
		h.observe(now, at, counts, 5)
		if h.over(now) {
			break
		}
	}
	if !h.Inexact || h.Loud != 20_000 || h.events() != 5 {
		t.Fatalf("inexact %t, quiet since %d, %d events; want true, 20000, 5", h.Inexact, h.Loud, h.events())
	}
}

func TestStormLooksAtMostHalfAPeriodApart(t *testing.T) {
	h := newHistory(10_000, 5, 60_000, 1000)
	h.Loud = 100_000
	if n := h.next(10_000); n != 40_000 {
		t.Fatalf("next look at %d, want 40000", n)
	}
	h.Loud = 10_500
	if n := h.next(20_000); n != 50_000 {
		t.Fatalf("next look at %d, want 50000", n)
	}
}
