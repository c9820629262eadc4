package deliverer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/snooze"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// Snoozes (klaxon snooze) are honoured here, where jobs are sent, rather
// than where the evaluator makes them: a held firing is then claimed and
// recorded ("snoozed") like any other, so a redelivered job is not held
// or sent twice; the check costs a Redis read per delivery job, not per
// event; and the summary at the end is one more message of the
// deliverer's own kind, with its claim, retries, pacing and failed queue.
// Firings a minPeriod digest gathered before the snooze began are sent
// with their digest.

// snoozePoll is the longest wait between checks of whether a snooze whose
// firings are held has ended: a snooze removed early gets its summary
// within about this long.
const snoozePoll = time.Minute

// heldFor is how long what a snooze held is kept after its end, for a
// summary delayed by a broker or provider outage.
const heldFor = 48 * time.Hour

// hold holds back firing f of job when its rule (or group) is snoozed, as
// snoozes (read with its claim) say: it is recorded as snoozed, and kept
// for the snooze's summary. held false means send it.
func (d *Deliverer) hold(ctx context.Context, job *wire.Job, f *wire.Firing, key string, snoozes *snooze.Lookup) (held bool, err error) {
	n := f.Notification
	now := d.now()
	sn, err := snoozes.Active(now)
	if err != nil || sn == nil {
		return false, err
	}
	if sn.Summary {
		body, err := json.Marshal(n)
		if err != nil {
			return false, fmt.Errorf("encode notification: %w", err)
		}
		r, err := d.scripts.hold.Run(ctx, d.rdb, []string{d.heldKey(sn, job.Channel)}, n.ID, body,
			d.cfg.DigestMaxFirings, (sn.Until.Sub(now) + heldFor).Milliseconds()).Int64()
		var schedule bool
		if err == nil {
			schedule, err = decodeHold(r)
		}
		if err != nil {
			return false, fmt.Errorf("hold %s for the snooze of rule %s: %w", n.ID, f.RuleID, err)
		}
		if schedule {
			if err := d.schedule(ctx, summaryJob(job, f.RuleID, sn), min(sn.Until.Sub(now), snoozePoll), false); err != nil {
				return false, err
			}
		}
	}
	d.metrics.Notifications.WithLabelValues(job.Channel, "snoozed").Inc()
	d.log.Info("notification held back: rule snoozed", "channel", job.Channel, "project", job.ProjectID,
		"rule", f.RuleID, "notification_id", n.ID, "snoozed_until", sn.Until)
	return true, d.record(ctx, key, "snoozed")
}

// heldKey is the hash of the firings a snooze held back on a channel.
func (d *Deliverer) heldKey(sn *snooze.Snooze, channel string) string {
	return d.cfg.Prefix + ":snoozed:" + sn.ID() + ":" + channel
}

// summaryJob is the job that sends, once sn, a snooze of rule, ended, what
// it held on job's channel.
func summaryJob(job *wire.Job, rule string, sn *snooze.Snooze) *wire.Job {
	return &wire.Job{Kind: wire.KindSnooze, Channel: job.Channel, Endpoint: job.Endpoint, ProjectID: job.ProjectID, RuleID: rule, Snooze: sn}
}

// deliverSummary sends what a snooze held back on a channel, as one
// digest with an id derived from the snooze, once the snooze has ended
// (run out, removed, or replaced by a new one); until then it checks back.
func (d *Deliverer) deliverSummary(ctx context.Context, job *wire.Job, token string) error {
	sn := job.Snooze
	now := d.now()
	cur, err := snooze.New(d.rdb, d.cfg.Prefix).Get(ctx, sn.ProjectID, sn.RuleID, sn.GroupHash)
	if err != nil {
		return err
	}
	if cur != nil && cur.ID() == sn.ID() && cur.Until.After(now) {
		return d.schedule(ctx, job, min(cur.Until.Sub(now), snoozePoll), false)
	}
	heldKey := d.heldKey(sn, job.Channel)
	all, err := d.rdb.HGetAll(ctx, heldKey).Result()
	if err != nil {
		return fmt.Errorf("read what the snooze of rule %s held: %w", sn.RuleID, err)
	}
	msg := &notify.Message{ID: "snooze-" + sn.ID(), ProjectID: job.ProjectID, RuleID: job.RuleID, Digest: true}
	for f, v := range all {
		if f == "#omitted" {
			msg.Omitted, _ = strconv.ParseInt(v, 10, 64)
		}
		if strings.HasPrefix(f, "#") {
			continue
		}
		var n notify.Notification
		if err := json.Unmarshal([]byte(v), &n); err != nil {
			d.log.Error("unusable firing held by a snooze: left out of its summary", "rule", job.RuleID, "error", err)
			continue
		}
		msg.Notifications = append(msg.Notifications, n)
	}
	if len(msg.Notifications) == 0 && msg.Omitted == 0 {
		return nil // sent and cleaned up by an earlier check, or nothing held
	}
	slices.SortFunc(msg.Notifications, cmpTimeThenID)
	// Once the summary is recorded, what the snooze held goes.
	return d.deliverOnce(ctx, job, d.claimKey(msg.ID+":"+job.Channel), token, msg, func(ctx context.Context) error {
		if err := d.rdb.Del(ctx, heldKey).Err(); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("drop what the snooze of rule %s held: %w", sn.RuleID, err)
		}
		return nil
	})
}
