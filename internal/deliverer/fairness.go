package deliverer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// Defaults of the fairness settings (Config).
const (
	DefaultMaxSendsPerDestination = 8
	DefaultMaxSendsPerProject     = 32
	DefaultCircuitTimeouts        = 5
	DefaultCircuitOpen            = 30 * time.Second
)

// errCircuitOpen is the failure of an attempt that a destination's open
// circuit kept from being made: the endpoint timed out again and again,
// and this attempt counts as one more timeout, retried after wait.
type errCircuitOpen struct{ wait time.Duration }

func (e *errCircuitOpen) Error() string {
	return fmt.Sprintf("not sent: the endpoint's circuit is open after repeated timeouts; it is tried again in %s", e.wait.Round(time.Millisecond))
}

// RetryAfter makes the retry wait for the circuit (notify.RetryAfter).
func (e *errCircuitOpen) RetryAfter() time.Duration { return e.wait }

// try is one attempt of a send, if the job's destination, its project and
// its provider's pace let it go now: scheduled reports that they did not
// and the job was put back to wait (err then says whether that worked).
// Otherwise retry and err are the attempt's, as from notify.Channel, where
// a destination whose circuit is open fails at once with errCircuitOpen.
func (d *Deliverer) try(ctx context.Context, job *wire.Job, key string, msg *notify.Message, release func(context.Context) error) (retry, scheduled bool, err error) {
	dest := destinationKey(job.Channel, job.Endpoint)
	// Before the pace: a job kept away by the circuit must not take a turn.
	if wait := d.dests.blocked(dest, time.Now()); wait > 0 {
		return true, false, &errCircuitOpen{wait: wait}
	}
	if scheduled, err := d.pace(ctx, job, dest, key, msg, release); scheduled || err != nil {
		return false, true, err
	}
	v := d.dests.enter(dest, job.ProjectID, time.Now())
	d.circuitChanged(job, dest, v.change, false)
	switch {
	case v.busy:
		// Not an attempt: the job comes back once a send may have ended.
		if err := release(ctx); err != nil {
			return false, true, fmt.Errorf("release claim %s: %w", key, err)
		}
		d.metrics.Notifications.WithLabelValues(job.Channel, "deferred").Inc()
		d.log.Debug("notification deferred: its destination or project has every send it may have in flight",
			"channel", job.Channel, "project", job.ProjectID, "notification_id", msg.ID, "wait", v.wait.String())
		next := *job
		next.Paced = false // its turn passes meanwhile
		return false, true, d.schedule(ctx, &next, v.wait, true)
	case v.slot == nil:
		return true, false, &errCircuitOpen{wait: v.wait}
	}
	ch, ok := d.channels[job.Channel]
	if !ok {
		d.dests.leave(v.slot, answered, time.Now())
		return false, false, fmt.Errorf("channel %s is not configured on this worker", job.Channel)
	}
	sctx, cancel := context.WithTimeout(ctx, d.cfg.SendTimeout)
	retry, err = ch.Notify(sctx, job.Endpoint, msg)
	o := answered
	switch {
	case ctx.Err() != nil:
		o = unknown
	case err != nil && (sctx.Err() != nil || isTimeout(err)):
		o = timedOut
	}
	cancel()
	d.circuitChanged(job, dest, d.dests.leave(v.slot, o, time.Now()), v.slot.probe)
	return retry, false, err
}

// pace holds a job to its provider's rate limit: it reserves the job's turn
// at the destination and, when that is later, puts the job back to come at
// it, once (scheduled). A job back at its turn goes without asking again,
// even late: a delay queue lets messages out in order, so one ahead with a
// longer wait can hold it past its turn, and asking again would send it to
// the back of the line, which under load starves the destination. The
// price is a rare pair of sends close together, which providers allow as a
// burst or answer with a 429 that is retried.
func (d *Deliverer) pace(ctx context.Context, job *wire.Job, dest, key string, msg *notify.Message, release func(context.Context) error) (scheduled bool, err error) {
	limits := d.cfg.Limits[job.Channel]
	if len(limits) == 0 || job.Paced {
		return false, nil
	}
	wait, err := d.limiter.Reserve(ctx, dest, limits...)
	if err != nil || wait <= 0 {
		return false, err
	}
	// Over the provider's pace: wait for the turn, without spending an attempt.
	if err := release(ctx); err != nil {
		return true, fmt.Errorf("release claim %s: %w", key, err)
	}
	d.metrics.Notifications.WithLabelValues(job.Channel, "throttled").Inc()
	d.log.Debug("notification paced", "channel", job.Channel, "notification_id", msg.ID, "wait", wait.String())
	next := *job
	next.Paced, next.NotBefore = true, time.Now().Add(wait)
	return true, d.schedule(ctx, &next, wait, true)
}

// circuitChanged logs and counts a change of a destination's circuit, once
// per change. The endpoint is never logged: the destination's hash names
// it, and the host when it is a URL.
func (d *Deliverer) circuitChanged(job *wire.Job, dest, state string, probe bool) {
	if state == "" {
		return
	}
	d.metrics.CircuitChanges.WithLabelValues(job.Channel, state).Inc()
	switch {
	case state == closed.String():
		d.metrics.CircuitsOpen.WithLabelValues(job.Channel).Dec()
	case state == open.String() && !probe:
		d.metrics.CircuitsOpen.WithLabelValues(job.Channel).Inc()
	}
	log := d.log.With("channel", job.Channel, "destination", dest, "host", endpointHost(job.Endpoint))
	switch state {
	case open.String():
		log.Warn("circuit opened: the endpoint keeps timing out; its jobs wait in the retry queues",
			"timeouts", d.cfg.CircuitTimeouts, "open_for", d.cfg.CircuitOpen.String(), "after_probe", probe)
	case halfOpen.String():
		log.Info("circuit half-open: one send probes the endpoint")
	case closed.String():
		log.Info("circuit closed: the endpoint answers again")
	}
}

// isTimeout reports whether err says the endpoint did not answer in time.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
