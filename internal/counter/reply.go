package counter

import (
	"errors"
	"fmt"
	"time"
)

// Kinds of reply items.
const (
	itemQuiet     = 0 // an outcome that did not fire (verbose replies only)
	itemFired     = 1
	itemReplayed  = 2 // a firing an earlier delivery caused
	itemDuplicate = 3 // the event's id was seen before
)

// decode turns a call's reply into Results: every event of the call gets
// its time and an empty outcome per rule, then the reply's items fill in
// what happened.
func decode(c *call, events []Event, results []Result) error {
	vals, err := c.cmd.Int64Slice()
	if err != nil {
		return err
	}
	if len(vals) == 0 {
		return errors.New("empty reply")
	}
	now := vals[0]
	var order []int // the call's events, as the script numbers them from 1
	for _, p := range c.parts {
		for _, i := range p.events {
			ev := &events[i]
			te := now
			if !ev.Time.IsZero() {
				if ts := eventMilli(ev.Time); ts >= 0 && ts <= now {
					te = ts
				}
			}
			outs := make([]Outcome, len(ev.Rules))
			for k, r := range ev.Rules {
				outs[k] = Outcome{Rule: r, Window: -1}
			}
			results[i] = Result{Time: time.UnixMilli(te), Outcomes: outs}
			order = append(order, i)
		}
	}
	for p := 1; p < len(vals); {
		if p+3 > len(vals) {
			return errors.New("reply cut inside an item")
		}
		ev, id, kind := vals[p], vals[p+1], vals[p+2]
		p += 3
		if ev < 1 || int(ev) > len(order) {
			return fmt.Errorf("reply names event %d of %d", ev, len(order))
		}
		i := order[ev-1]
		if kind == itemDuplicate {
			results[i].Duplicate = true
			continue
		}
		if p+4 > len(vals) || vals[p+3] < 0 || p+4+int(vals[p+3]) > len(vals) {
			return errors.New("reply cut inside an outcome")
		}
		at, rearm, which, nw := vals[p], vals[p+1], vals[p+2], int(vals[p+3])
		counts := vals[p+4 : p+4+nw : p+4+nw]
		p += 4 + nw
		k := ruleIndex(&events[i], id)
		if k < 0 {
			continue // a replayed firing of a rule the event no longer has
		}
		o := &results[i].Outcomes[k]
		rule := o.Rule
		if nw != countsOf(rule) || which >= int64(len(rule.Windows)) {
			// The rule has other windows now: what fired then cannot be told
			// in today's terms, so it is not told at all.
			if kind == itemReplayed {
				continue
			}
			return fmt.Errorf("reply has %d counts for rule %s of %d", nw, rule.ID, countsOf(rule))
		}
		if o.Fired && kind == itemReplayed {
			continue // fired now: that firing is the one to tell
		}
		*o = Outcome{
			Rule: rule, Fired: kind != itemQuiet, Replayed: kind == itemReplayed,
			Window: int(which), Counts: counts, At: unixMilli(at), Rearm: unixMilli(rearm),
		}
		if o.Fired {
			o.ID = FiringID(events[i].ProjectID, rule.ID, events[i].GroupHash, o.At)
		}
	}
	return nil
}

// ruleIndex is the index among ev.Rules of the rule whose idTag is id, or
// -1: a replayed firing goes to its own rule, even if the rule was edited,
// added, removed or moved since.
func ruleIndex(ev *Event, id int64) int {
	for k, r := range ev.Rules {
		if idTag(r) == id {
			return k
		}
	}
	return -1
}

// unixMilli is t in ms, with 0 (a state never written) as the zero time.
func unixMilli(t int64) time.Time {
	if t == 0 {
		return time.Time{}
	}
	return time.UnixMilli(t)
}
