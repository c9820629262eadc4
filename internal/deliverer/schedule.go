package deliverer

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// delays is the retry ladder (wire.RetryDelays), shortest first.
var delays = wire.RetryDelays()

// delayQueue is the retry queue holding jobs for delay, a rung of delays.
func (d *Deliverer) delayQueue(delay time.Duration) string {
	return wire.RetryQueue(d.cfg.Prefix, delay)
}

// schedule publishes job to come back on the delivery queue after delay:
// through the longest retry queue not over it when atLeast is false (a
// flush that must not come late, and is re-checked on arrival), or the
// shortest at or over it, expiring at delay, when atLeast is true (a retry
// that must not come too soon, a turn reserved at the provider's pace).
func (d *Deliverer) schedule(ctx context.Context, job *wire.Job, delay time.Duration, atLeast bool) error {
	body, err := json.Marshal(job)
	if err != nil {
		return fmt.Errorf("encode job: %w", err)
	}
	rung := pickDelay(delay, atLeast)
	q := d.delayQueue(rung)
	id := "flush" // a flush or a snooze summary
	if job.Kind == wire.KindFirings {
		id = job.Key()
	}
	m := queue.Message{RoutingKey: q, Body: body, MessageID: id, ContentType: "application/json"}
	if atLeast && delay < rung {
		// Out at delay rather than the rung's TTL, unless a message ahead
		// in the queue holds it (a queue lets messages out in order).
		m.Expiration = delay
	}
	if err := d.pub.Publish(ctx, m); err != nil {
		return fmt.Errorf("schedule %s on %s: %w", id, q, err)
	}
	return nil
}

// pickDelay picks a rung of the retry ladder for delay: the shortest at or
// over it when atLeast, else the longest at or under it (the shortest if
// none is).
func pickDelay(delay time.Duration, atLeast bool) time.Duration {
	if atLeast {
		for _, l := range delays {
			if l >= delay {
				return l
			}
		}
		return delays[len(delays)-1]
	}
	pick := delays[0]
	for _, l := range delays {
		if l <= delay {
			pick = l
		}
	}
	return pick
}

// backoff is the wait before attempt n (1 = the first retry): 1 s doubling
// up to 512 s, and at random half of that, so that deliverers retrying
// together spread out.
func backoff(n int) time.Duration {
	i := min(3+n-1, len(delays)-1) // delays[3] is 1 s
	return delays[i-mrand.IntN(2)]
}
