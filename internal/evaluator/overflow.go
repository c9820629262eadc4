package evaluator

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/livegroups"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// LiveGroups bounds the groups a project keeps a counting state for
// (livegroups.Cap).
type LiveGroups interface {
	// AnyFull reports whether some project is over its bound: when none
	// is, a batch costs no lookup at all.
	AnyFull() bool
	// Overflowing says which (project, group)s are to be counted as
	// livegroups.Overflow; nil when none.
	Overflowing(ctx context.Context, groups [][2]string) ([]bool, error)
	// Saw records a group counted with rules whose state lives lifetime.
	Saw(project, group string, lifetime time.Duration)
}

// overflowed is what counting a batch of a full project changes: the
// events as counted, and for each event counted as the overflow group the
// ONLY_NEW rules it matched, which fire without a state.
type overflowed struct {
	events    []counter.Event // as they came
	counted   []counter.Event
	stateless map[int][]*rules.Rule
}

// overflow returns the batch's events as they are counted: as they came,
// but for the events of a full project's groups without a state, which
// count under livegroups.Overflow without their ONLY_NEW rules.
func (e *Evaluator) overflow(ctx context.Context, events []counter.Event, regs *regressions) (overflowed, error) {
	o := overflowed{events: events, counted: events}
	if e.Live == nil || len(events) == 0 || !e.Live.AnyFull() {
		return o, nil
	}
	groups := make([][2]string, len(events))
	for i := range events {
		groups[i] = [2]string{events[i].ProjectID, events[i].GroupHash}
	}
	over, err := e.Live.Overflowing(ctx, groups)
	if err != nil {
		return o, fmt.Errorf("look up the states of full projects' groups: %w", err)
	}
	if over == nil {
		return o, nil
	}
	o.counted = slices.Clone(events)
	for i, yes := range over {
		if !yes {
			continue
		}
		ev := &o.counted[i]
		ev.GroupHash = livegroups.Overflow
		var keep []*rules.Rule
		for _, r := range ev.Rules {
			if _, regressed := regs.lookup(r); r.OnlyNew && !regressed {
				if o.stateless == nil {
					o.stateless = make(map[int][]*rules.Rule)
				}
				o.stateless[i] = append(o.stateless[i], r)
				continue
			}
			keep = append(keep, r)
		}
		ev.Rules = keep
		e.Metrics.OverflowEvents.Inc()
	}
	return o, nil
}

// observe counts o.counted, and fires the stateless rules of the events
// counted as the overflow group: a new error fires an ONLY_NEW rule by
// itself, with an id of its rule and its own group, so that the same new
// error told twice is sent once.
func (e *Evaluator) observe(ctx context.Context, batchID int64, o overflowed) ([]counter.Result, error) {
	if o.stateless == nil {
		return e.Counter.ObserveBatch(ctx, batchID, o.counted)
	}
	var counting []counter.Event
	var at []int
	for i := range o.counted {
		if len(o.counted[i].Rules) > 0 {
			counting, at = append(counting, o.counted[i]), append(at, i)
		}
	}
	var counted []counter.Result
	if len(counting) > 0 {
		var err error
		if counted, err = e.Counter.ObserveBatch(ctx, batchID, counting); err != nil {
			return nil, err
		}
	}
	results := make([]counter.Result, len(o.counted))
	for k, i := range at {
		results[i] = counted[k]
	}
	now := time.Now()
	for i, rs := range o.stateless {
		if results[i].Time.IsZero() {
			results[i].Time = now
		}
		for _, r := range rs {
			results[i].Outcomes = append(results[i].Outcomes, counter.Outcome{
				Rule: r, Fired: true, Window: -1, At: results[i].Time,
				ID: counter.FiringID(o.events[i].ProjectID, r.ID, o.events[i].GroupHash, time.Time{}),
			})
		}
	}
	return results, nil
}

// sawGroups tells Live of the groups the batch counted on their own.
func (e *Evaluator) sawGroups(o overflowed, results []counter.Result) {
	if e.Live == nil {
		return
	}
	for i := range o.counted {
		ev := &o.counted[i]
		if ev.GroupHash == livegroups.Overflow || len(ev.Rules) == 0 || results[i].Duplicate {
			continue
		}
		var lifetime time.Duration
		for _, r := range ev.Rules {
			lifetime = max(lifetime, r.MaxPeriod(), r.Cooldown)
		}
		e.Live.Saw(ev.ProjectID, ev.GroupHash, lifetime)
	}
}
