package counter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// Inspect reads a group's state without changing it and tells, for each
// rule, what the counter holds now: the rule's clock (At, the newest event
// it counted), when it rearms (Rearm), and each window's count as of the
// newest event its ring has seen, the way the next event would find it
// before counting itself, and so each spike window's baseline (Baseline).
// It also returns Redis' clock. A rule the group never counted has a zero
// At; for operators' tools (klaxon explain).
func (e *Engine) Inspect(ctx context.Context, projectID, groupHash string, rs []*rules.Rule) ([]Outcome, time.Time, error) {
	base := GroupKey(e.prefix, projectID, groupHash)
	users := make(map[[2]int]*redis.IntCmd) // by rule and window
	st, now, err := e.readState(ctx, base)
	if err != nil {
		return nil, time.Time{}, err
	}
	var b batch
	outs := make([]Outcome, len(rs))
	for i, r := range rs {
		info := b.info(r)
		o := Outcome{Rule: r, Window: -1, Counts: make([]int64, len(info.rings))}
		for _, s := range st.rules {
			if s.tag == info.state && s.until > now {
				o.At, o.Rearm = unixMilli(s.at), unixMilli(s.rearm)
			}
		}
		if !r.Users {
			for w, spec := range info.rings {
				for _, ring := range st.rings {
					if ring.tag == spec.tag && ring.until > now {
						lo := floorDiv(ring.at-spec.period, spec.bucket)
						for k := 0; k+1 < len(ring.pairs); k += 2 {
							if ring.pairs[k] >= lo {
								o.Counts[w] += ring.pairs[k+1]
							}
						}
					}
				}
			}
		}
		outs[i] = o
	}
	_, err = e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, o := range outs {
			if !o.Rule.Users || o.At.IsZero() {
				continue
			}
			for w, spec := range o.Rule.Windows {
				from := "(" + strconv.FormatInt(o.At.UnixMilli()-spec.Period.Milliseconds(), 10)
				users[[2]int{i, w}] = p.ZCount(ctx, base+":u:"+strconv.FormatInt(b.info(o.Rule).state, 10), from, "+inf")
			}
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("count users of %s: %w", base, err)
	}
	for k, c := range users {
		outs[k[0]].Counts[k[1]] = c.Val()
	}
	return outs, time.UnixMilli(now), nil
}

// readState reads a group's state string and Redis' clock (ms), in one
// round trip, without changing anything.
func (e *Engine) readState(ctx context.Context, base string) (*groupState, int64, error) {
	var clock *redis.TimeCmd
	var get *redis.StringCmd
	_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		get = p.Get(ctx, base+":s")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("read state of %s: %w", base, err)
	}
	raw, err := get.Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("read state of %s: %w", base, err)
	}
	now := clock.Val().UnixMilli()
	return decodeState(raw, now, now/e.dedupTTL), now, nil
}

// Ring is what one window's ring of buckets holds, read without changing
// it: the history a "storm over" check (package storm) needs, since a
// window's count alone cannot say when it was last at its threshold.
type Ring struct {
	// Now is Redis' clock when the ring was read.
	Now time.Time
	// At is the ring's clock (the newest event it counted); zero when the
	// group has no live ring for the window: nothing counted within about
	// a period before Now.
	At time.Time
	// Bucket is the buckets' width (Resolution of the period).
	Bucket time.Duration
	// Counts maps a bucket (ms since the epoch / Bucket, floored) to the
	// events it holds; only buckets of the window ending at At, from
	// floor((At-period)/Bucket), are kept, and only those that hold events.
	Counts map[int64]int64
}

// Ring reads window w's ring of rule r for a group, read-only like
// Inspect. A rule counting users has no ring: an error.
func (e *Engine) Ring(ctx context.Context, projectID, groupHash string, r *rules.Rule, w int) (Ring, error) {
	if r.Users || w < 0 || w >= len(r.Windows) {
		return Ring{}, fmt.Errorf("rule %s has no ring for window %d", r.ID, w)
	}
	st, now, err := e.readState(ctx, GroupKey(e.prefix, projectID, groupHash))
	if err != nil {
		return Ring{}, err
	}
	period := r.Windows[w].Period
	out := Ring{Now: time.UnixMilli(now), Bucket: Resolution(period), Counts: map[int64]int64{}}
	tag, bucket := ringTag(r, period), Resolution(period).Milliseconds()
	for _, ring := range st.rings {
		if ring.tag != tag || ring.until <= now {
			continue
		}
		out.At = time.UnixMilli(ring.at)
		lo := floorDiv(ring.at-period.Milliseconds(), bucket)
		for k := 0; k+1 < len(ring.pairs); k += 2 {
			if ring.pairs[k] >= lo && ring.pairs[k+1] > 0 {
				out.Counts[ring.pairs[k]] += ring.pairs[k+1]
			}
		}
	}
	return out, nil
}
