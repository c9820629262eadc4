package deliverer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/snooze"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// outcome is what one send of a message came to. send decides it, settle
// acts on it, and nothing else does either.
type outcome struct {
	kind outcomeKind
	// err is why the message was not sent (outcomeRetry, outcomeFailed).
	err error
	// after is, for outcomeRetry, the least wait its provider asked for
	// (a Retry-After; 0 for none), and for outcomeWait, the wait for the
	// job's turn.
	after time.Duration
	// paced is set, for outcomeWait, when the turn is one reserved at the
	// provider's pace; else full names the budget that had every send it
	// may have in flight (budgets.go).
	paced bool
	full  string
	// took is how long the send took, for the log.
	took time.Duration
}

type outcomeKind int

const (
	outcomeSent   outcomeKind = iota // the provider took it
	outcomeRetry                     // failed, worth trying again after a while
	outcomeFailed                    // failed for good
	outcomeWait                      // not tried: its turn comes after a while
)

// failure is the outcome of a failed attempt, as the channel judged it.
func failure(retry bool, err error) outcome {
	if !retry {
		return outcome{kind: outcomeFailed, err: err}
	}
	o := outcome{kind: outcomeRetry, err: err}
	var after notify.RetryAfter
	if errors.As(err, &after) {
		o.after = after.RetryAfter()
	}
	return o
}

// admission is what a firing's claim, its rule's snooze, its quiet hours
// and its minPeriod make of it.
type admission int

const (
	admitted      admission = iota // claimed by us: send it now
	settledBefore                  // sent, failed, digested, omitted, snoozed or quiet: nothing left to do
	heldElsewhere                  // another deliverer holds its claim
)

// admit takes firing f of job through its claim, its rule's snooze (hold),
// the quiet period it was made in (holdQuiet) and its rule's minPeriod on
// the channel (gather), recording what they make of it. admitted leaves the firing claimed, f.Gated set when it
// passed the minPeriod gate; heldElsewhere comes with the wait until the
// other deliverer's claim expires.
func (d *Deliverer) admit(ctx context.Context, job *wire.Job, f *wire.Firing, token string) (admission, time.Duration, error) {
	key := d.claimKey(wire.FiringKey(f.Notification.ID, job.Channel))
	if ok, err := d.settled(ctx, key); ok {
		return settledBefore, 0, err
	}
	// The rule's snoozes are read with the claim: one round trip for both.
	var snoozes *snooze.Lookup
	state, wait, err := d.claimAndRead(ctx, key, token, func(c redis.Cmdable) {
		snoozes = snooze.New(d.rdb, d.cfg.Prefix).Lookup(ctx, c, job.ProjectID, f.RuleID, f.Notification.Event.GroupHash)
	})
	if err != nil {
		return 0, 0, err
	}
	switch state {
	case done:
		d.metrics.Notifications.WithLabelValues(job.Channel, "duplicate").Inc()
		return settledBefore, 0, nil
	case busy:
		return heldElsewhere, wait, nil
	}
	if held, err := d.hold(ctx, job, f, key, snoozes); held || err != nil {
		return settledBefore, 0, err
	}
	if f.Quiet != nil {
		if held, err := d.holdQuiet(ctx, job, f, key); held || err != nil {
			return settledBefore, 0, err
		}
	}
	if f.MinPeriod > 0 && !f.Gated {
		gathered, omitted, err := d.gather(ctx, job, f)
		if err != nil {
			return 0, 0, err
		}
		if omitted {
			// Counted in the digest's "omitted", not listed: the digest
			// is full.
			d.metrics.Notifications.WithLabelValues(job.Channel, "omitted").Inc()
			return settledBefore, 0, d.record(ctx, key, "omitted")
		}
		if gathered {
			d.metrics.Notifications.WithLabelValues(job.Channel, "digested").Inc()
			return settledBefore, 0, d.record(ctx, key, "digested")
		}
		f.Gated = true
	}
	return admitted, 0, nil
}

// deliverMessage sends msg, claimed under keys (one per firing it carries,
// or the digest's or summary's one), and settles the outcome.
// recorded reports that msg is now recorded as sent or failed: what it was
// made of (a digest in flight, a snooze's held firings) may go.
//
// ctx ends when the broker channel that delivered the job dies, not only
// when the worker stops. A send the provider may already have taken must
// not be cut off then, nor its outcome go unrecorded: the job comes again,
// and would be sent again. So callers give the send and what follows it
// sendGrace after ctx ends (withGrace).
func (d *Deliverer) deliverMessage(ctx context.Context, job *wire.Job, keys []string, msg *notify.Message) (recorded bool, err error) {
	start := time.Now()
	o, err := d.send(ctx, job, msg)
	if err != nil {
		return false, err
	}
	o.took = time.Since(start)
	return d.settle(ctx, job, keys, msg, o)
}

// deliverOnce sends msg, a message of job's own (a snooze's summary, a
// quiet period's recap), once under claim key, and then runs cleanup:
// once msg is recorded sent or failed, by this try or an earlier one.
func (d *Deliverer) deliverOnce(ctx context.Context, job *wire.Job, key, token string, msg *notify.Message,
	cleanup func(context.Context) error) error {
	if ok, err := d.settled(ctx, key); ok {
		if err != nil {
			return err
		}
		return cleanup(ctx)
	}
	state, wait, err := d.claim(ctx, key, token)
	switch {
	case err != nil:
		return err
	case state == done:
		return cleanup(ctx)
	case state == busy:
		return d.schedule(ctx, job, wait, true)
	}
	ctx, cancel := withGrace(ctx, sendGrace)
	defer cancel()
	if recorded, err := d.deliverMessage(ctx, job, []string{key}, msg); !recorded {
		return err
	}
	return cleanup(ctx)
}

// send is one attempt of msg, if the job's budgets (its host, address,
// project and channel) and its provider's pace let it go now; else the
// outcome says when its turn comes. A host whose circuit is open fails at once with
// errCircuitOpen. err is for what leaves the outcome unknown: Redis
// failing, or ctx ending during the send (the provider may or may not have
// the message).
func (d *Deliverer) send(ctx context.Context, job *wire.Job, msg *notify.Message) (outcome, error) {
	// Opened here, in memory, for the send alone: the job keeps the sealed
	// form for its retries, the failed queue and a digest in Redis.
	endpoint, err := d.cfg.Keys.Open(job.Endpoint, job.ProjectID, job.Channel)
	if err != nil {
		d.metrics.EndpointsUnopened.WithLabelValues(job.Channel).Inc()
		return failure(false, err), nil
	}
	t := d.target(ctx, job, endpoint)
	// Before the pace: a job kept away by the circuit must not take a turn.
	if wait := d.budgets.blocked(t.host, d.now()); wait > 0 {
		return failure(true, &errCircuitOpen{wait: wait}), nil
	}
	if wait, err := d.pace(ctx, job, paceKey(job.Channel, d.cfg.Keys.Tag(endpoint))); err != nil || wait > 0 {
		return outcome{kind: outcomeWait, after: wait, paced: true}, err
	}
	v := d.budgets.enter(t, d.now())
	d.circuitChanged(job, t.host, v.change, false)
	switch {
	case v.full != "":
		return outcome{kind: outcomeWait, after: v.wait, full: v.full}, nil
	case v.slot == nil:
		return failure(true, &errCircuitOpen{wait: v.wait}), nil
	}
	ch, ok := d.channels[job.Channel]
	if !ok {
		d.budgets.leave(v.slot, answered, d.now())
		return failure(false, fmt.Errorf("channel %s is not configured on this worker", job.Channel)), nil
	}
	sctx, cancel := context.WithTimeout(ctx, d.cfg.SendTimeout)
	retry, err := ch.Notify(sctx, endpoint, msg)
	o := answered
	switch {
	case ctx.Err() != nil:
		o = unknown
	case err != nil && (sctx.Err() != nil || isTimeout(err)):
		o = timedOut
	}
	cancel()
	d.circuitChanged(job, t.host, d.budgets.leave(v.slot, o, d.now()), v.slot.probe)
	if err == nil {
		return outcome{kind: outcomeSent}, nil
	}
	return failure(retry, err), nil
}

// settle acts on the outcome of a send of msg, claimed under keys: records
// it as sent; or releases the claim and schedules the job for its turn or
// its retry; or sends the job to the failed queue and records it as
// failed. recorded reports that msg was recorded as sent or failed.
func (d *Deliverer) settle(ctx context.Context, job *wire.Job, keys []string, msg *notify.Message, o outcome) (recorded bool, err error) {
	if o.kind == outcomeWait {
		return false, d.waitTurn(ctx, job, keys, msg, o)
	}
	log := d.log.With("channel", job.Channel, "project", job.ProjectID, "rule", job.Rule(),
		"notification_id", msg.ID, "firings", len(msg.Notifications), "attempt", job.Attempt+1)
	if o.kind == outcomeSent {
		d.metrics.Notifications.WithLabelValues(job.Channel, "sent").Inc()
		for _, n := range msg.Notifications {
			d.metrics.DeliveryLatency.WithLabelValues(job.Channel).Observe(time.Since(n.FiredAt).Seconds())
		}
		err := d.recordAll(ctx, keys, "sent")
		// Said once the record is made or refused: a process killed
		// between the send and its record leaves no recorded=true line
		// (tools/chaos reads it to tell a crash's repeat from a lost record).
		log.Info("notification sent", "took_ms", o.took.Milliseconds(), "recorded", err == nil)
		if err != nil {
			d.remember(keys, "sent")
			return false, err
		}
		d.periodsFromSendEnd(ctx, job)
		return true, nil
	}
	if ctx.Err() != nil {
		// Cut short: the provider may or may not have the message. The
		// claim stays until it expires, then the job, which was not acked
		// and comes again, is sent again.
		return false, ctx.Err()
	}
	if _, parked := errors.AsType[*errCircuitOpen](o.err); parked && !d.tooOld(msg.Notifications) {
		return false, d.park(ctx, job, keys, o.after)
	}
	if o.kind == outcomeRetry && job.Attempt+1 < d.cfg.MaxAttempts {
		return false, d.retry(ctx, job, keys, o, log)
	}
	if err := d.fail(ctx, job, msg, o, log); err != nil {
		return false, err
	}
	if err := d.recordAll(ctx, keys, "failed"); err != nil {
		d.remember(keys, "failed")
		return false, err
	}
	return true, nil
}

// waitTurn puts back a job that was not tried, to come at its turn: one
// reserved at its provider's pace, or once a send of its full budget may
// have ended. It spends no attempt.
func (d *Deliverer) waitTurn(ctx context.Context, job *wire.Job, keys []string, msg *notify.Message, o outcome) error {
	if err := d.release(ctx, keys...); err != nil {
		return err
	}
	next := *job
	if o.paced {
		d.metrics.Notifications.WithLabelValues(job.Channel, "throttled").Inc()
		d.log.Debug("notification paced", "channel", job.Channel, "notification_id", msg.ID, "wait", o.after.String())
		next.Paced, next.NotBefore = true, d.now().Add(o.after)
		return d.schedule(ctx, &next, o.after, true)
	}
	return d.deferJob(ctx, &next, o.full, o.after)
}

// retry schedules the next attempt of a job whose send failed, after the
// backoff or the provider's Retry-After, whichever is longer.
func (d *Deliverer) retry(ctx context.Context, job *wire.Job, keys []string, o outcome, log *slog.Logger) error {
	if err := d.release(ctx, keys...); err != nil {
		return err
	}
	next := *job
	next.Attempt++
	next.Paced = false // a retry takes a turn of its own
	// A Retry-After sets the earliest retry, not the pace: taken instead
	// of the backoff, a short one answered again and again would spend
	// every attempt within seconds and lose the message.
	delay := max(o.after, backoff(next.Attempt))
	next.NotBefore = time.Time{}
	if longest := delays[len(delays)-1]; delay > longest {
		next.NotBefore = d.now().Add(delay)
	}
	log.Warn("notification failed, will retry", "error", o.err, "retry_in", delay.String())
	d.metrics.Notifications.WithLabelValues(job.Channel, "retried").Inc()
	return d.schedule(ctx, &next, delay, true)
}

// park puts back a job that its host's open circuit kept from being sent,
// until the circuit lets a send through. The circuit says nothing of the
// job, only of its host: it spends no attempt and no backoff, so that a
// provider down for an hour loses nothing and its messages go out as soon
// as a probe finds it answering. Only a job parked past Keep fails, since
// past it a "sent" record may be gone and the message could go twice.
// keys are its claims, none when it was parked before it was claimed.
func (d *Deliverer) park(ctx context.Context, job *wire.Job, keys []string, wait time.Duration) error {
	if len(keys) > 0 {
		if err := d.release(ctx, keys...); err != nil {
			return err
		}
	}
	next := *job
	next.Paced = false
	next.NotBefore = time.Time{}
	// Logged once, when the circuit opened, not once a job.
	d.log.Debug("notification parked until its host's circuit lets a send through",
		"channel", job.Channel, "project", job.ProjectID, "retry_in", wait.String())
	d.metrics.Notifications.WithLabelValues(job.Channel, "parked").Inc()
	return d.schedule(ctx, &next, wait, true)
}

// tooOld reports whether any of the firings ns is older than Keep.
func (d *Deliverer) tooOld(ns []notify.Notification) bool {
	for _, n := range ns {
		if !n.FiredAt.IsZero() && d.now().Sub(n.FiredAt) > d.cfg.Keep {
			return true
		}
	}
	return false
}

// fail publishes a job that failed for good to the failed queue, with the
// reason in its header and the firings it carried in its body.
func (d *Deliverer) fail(ctx context.Context, job *wire.Job, msg *notify.Message, o outcome, log *slog.Logger) error {
	err := o.err
	switch {
	case !netguard.IsRefused(err):
		log.Error("notification failed for good", "error", err, "retryable", o.kind == outcomeRetry)
	case d.refused.first(job.ProjectID+"\x00"+job.Rule()+"\x00"+job.Channel, d.now()):
		// The reason names an address or host, never the endpoint URL.
		log.Error("endpoint refused",
			"error", err)
	default:
		log.Debug("notification failed for good", "error", err)
	}
	d.metrics.Notifications.WithLabelValues(job.Channel, "failed").Inc()
	body, jerr := wire.FailedRecord(job, msg.Notifications)
	if jerr != nil {
		return jerr
	}
	if err := d.pub.Publish(ctx, queue.Message{
		RoutingKey: d.cfg.FailedQueue, Body: body, MessageID: msg.ID + ":" + job.Channel,
		ContentType: "application/json", Headers: amqp.Table{wire.ErrorHeader: err.Error()}, Timestamp: d.now(),
	}); err != nil {
		return fmt.Errorf("record failed notification: %w", err)
	}
	return nil
}

// sendGrace is how long a send under way, and the record of its outcome,
// may go on once the job's context has ended. With the consumer's stop
// grace (5 s), a stopping worker still exits within 10 s.
const sendGrace = 3 * time.Second

// withGrace returns a context that ends grace after ctx does (or when
// cancel is called), with ctx's values.
func withGrace(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-gctx.Done():
		}
	})
	return gctx, func() { stop(); cancel() }
}
