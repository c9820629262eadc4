package evaluator

import (
	"context"
	"log/slog"
	"time"

	"github.com/klaxonhq/klaxon/internal/counter"
)

// Outcomes of incoming events: the values of klaxon_events_total's label.
const (
	outCounted = iota
	outDuplicate
	outUnmatched
	outNoRules
	outDead
	outcomes
)

// tally counts a batch's events by outcome.
type tally [outcomes]int

func outcomeName(o int) string {
	switch o {
	case outCounted:
		return "counted"
	case outDuplicate:
		return "duplicate"
	case outUnmatched:
		return "unmatched"
	case outNoRules:
		return "no_rules"
	}
	return "dead"
}

// record counts a finished batch in the metrics and logs its firings; a
// batch that failed and comes again is thus counted once.
func (e *Evaluator) record(tally tally, events []counter.Event, results []counter.Result, regs *regressions) {
	evaluated := 0
	trace := e.Log.Enabled(context.Background(), slog.LevelDebug)
	for i, res := range results {
		ev := &events[i]
		if trace {
			e.traceEvent(ev, &res)
		}
		if res.Duplicate {
			tally[outDuplicate]++
		} else {
			tally[outCounted]++
			if !ev.Time.IsZero() {
				e.Metrics.EventLag.Observe(time.Since(ev.Time).Seconds())
			}
		}
		evaluated += len(res.Outcomes)
		for k := range res.Outcomes {
			o := &res.Outcomes[k]
			if !o.Fired {
				continue
			}
			kind := kind(o, regs)
			if !o.Replayed {
				e.Metrics.Firings.WithLabelValues(kind).Inc()
			}
			e.Log.Info("rule fired", "project", ev.ProjectID, "rule", o.Rule.ID, "group", ev.GroupHash,
				"type", kind, "window", o.Window, "counts", o.Counts, "notification_id", o.ID,
				"channels", len(o.Rule.Channels), "replayed", o.Replayed)
		}
	}
	if evaluated > 0 {
		e.Metrics.RulesEvaluated.Add(float64(evaluated))
	}
	for outcome, n := range tally {
		if n > 0 {
			e.Metrics.Events.WithLabelValues(outcomeName(outcome)).Add(float64(n))
		}
	}
}

// traceEvent logs, at debug, what counting made of one event: with every
// event's identity and outcome in the logs, a notification missing after a
// failure can be followed to the batch that counted (or did not count) its
// events.
func (e *Evaluator) traceEvent(ev *counter.Event, res *counter.Result) {
	var fired []string
	for k := range res.Outcomes {
		if o := &res.Outcomes[k]; o.Fired {
			fired = append(fired, o.Rule.ID)
		}
	}
	e.Log.Debug("event counted", "project", ev.ProjectID, "group", ev.GroupHash, "id", ev.ID,
		"redelivered", ev.Redelivered, "duplicate", res.Duplicate, "fired", fired)
}
