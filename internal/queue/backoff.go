package queue

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential delay with jitter: attempt n waits a random time
// between half and all of min(Max, Min·2ⁿ⁻¹). The jitter keeps a fleet of
// workers that lost the broker together from reconnecting in lockstep.
type Backoff struct {
	Min time.Duration // first delay; default 100 ms
	Max time.Duration // cap; default 10 s
}

func (b Backoff) withDefaults() Backoff {
	if b.Min <= 0 {
		b.Min = 100 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 10 * time.Second
	}
	if b.Max < b.Min {
		b.Max = b.Min
	}
	return b
}

// Delay returns the wait before attempt n (n ≥ 1) of a run of failures.
func (b Backoff) Delay(n int) time.Duration {
	b = b.withDefaults()
	d := b.Max
	if n < 1 {
		n = 1
	}
	if n <= 62 {
		if e := b.Min << (n - 1); e > 0 && e < b.Max {
			d = e
		}
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// sleep waits for d or until ctx is done, reporting whether the full time passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
