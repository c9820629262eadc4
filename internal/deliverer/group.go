package deliverer

import (
	"context"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// A firings job carries one firing, or the firings of several rules for
// one event that share its destination (docs/contract.md §5.8). Each
// firing is admitted on its own: its claim under its own key
// (wire.FiringKey), its rule's snooze, its rule's minPeriod. What is
// admitted goes as one message; the outcome is recorded under every
// firing's key. So a firing is sent once whichever job carries
// it: a replay that groups another set of firings (a rule edited in
// between) finds those already sent recorded and sends the rest, and a
// firing inside its rule's minPeriod goes to that rule's digest, never
// around it.

// deliverFirings sends the firings of a firings job that are still to be
// sent, as one message: a grouped message, or a single firing's own when
// one is left.
func (d *Deliverer) deliverFirings(ctx context.Context, job *wire.Job, token string) error {
	var now, later []wire.Firing
	var wait time.Duration
	for _, f := range job.Firings {
		a, w, err := d.admit(ctx, job, &f, token)
		if err != nil {
			// Claims taken so far are this delivery's: the batch's next
			// try finds them its own.
			return err
		}
		switch a {
		case admitted:
			now = append(now, f)
		case heldElsewhere:
			later = append(later, f)
			wait = max(wait, w)
		}
	}
	if len(later) > 0 {
		// Another deliverer holds these (another job carrying the same
		// firings): they come back once its claims are settled or have
		// expired; what is ours goes now rather than wait for them.
		next := withFirings(job, later)
		if err := d.schedule(ctx, &next, wait, true); err != nil {
			return err
		}
	}
	if len(now) == 0 {
		return nil
	}
	next := withFirings(job, now)
	msg, keys := d.firingsMessage(&next)
	ctx, cancel := withGrace(ctx, sendGrace)
	defer cancel()
	_, err := d.deliverMessage(ctx, &next, keys, msg)
	return err
}

// firingsMessage is the message of a firings job, and the claim keys of
// its firings: a single firing's own, or the grouped message, its id
// derived from the firings' ids.
func (d *Deliverer) firingsMessage(job *wire.Job) (*notify.Message, []string) {
	if len(job.Firings) == 1 {
		f := job.Firings[0]
		return &notify.Message{ID: f.Notification.ID, ProjectID: job.ProjectID, RuleID: f.RuleID, Notifications: []notify.Notification{*f.Notification}},
			[]string{d.claimKey(job.Key())}
	}
	msg := &notify.Message{ProjectID: job.ProjectID, Grouped: true}
	ids := make([]string, len(job.Firings))
	keys := make([]string, len(job.Firings))
	for i, f := range job.Firings {
		ids[i], keys[i] = f.Notification.ID, d.claimKey(wire.FiringKey(f.Notification.ID, job.Channel))
		msg.Notifications = append(msg.Notifications, *f.Notification)
	}
	msg.ID = wire.GroupID(ids)
	return msg, keys
}

// withFirings is job carrying only fs, with job's attempts and turn.
func withFirings(job *wire.Job, fs []wire.Firing) wire.Job {
	next := *job
	next.Firings = fs
	return next
}
