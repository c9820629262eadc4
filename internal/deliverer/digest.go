package deliverer

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// minPeriodKeys are the keys of the minPeriod of a flush job's (rule,
// channel).
func (d *Deliverer) minPeriodKeys(job *wire.Job) minPeriodKeys {
	base := d.cfg.Prefix + ":{mp:" + job.ProjectID + ":" + job.RuleID + ":" + job.Channel + "}"
	return minPeriodKeys{state: base, pending: base + ":pending", inflight: base + ":inflight", gathered: base + ":gathered"}
}

// periodsFromSendEnd starts the minPeriod of every (rule, channel) whose
// message job just sent at the end of the send, not at its gate: a send
// that took long (a slow provider, a retry) must not let the next message
// reach the provider sooner than minPeriod after this one. It fails
// quietly: the message is sent and recorded, and a period left running
// from the gate only lets a digest come by the send's time early.
func (d *Deliverer) periodsFromSendEnd(ctx context.Context, job *wire.Job) {
	var keys []string
	if job.MinPeriod > 0 { // a flush
		keys = append(keys, d.minPeriodKeys(job).state)
	}
	for _, f := range job.Firings {
		if f.MinPeriod > 0 {
			keys = append(keys, d.minPeriodKeys(flushJob(job, f.RuleID, f.MinPeriod)).state)
		}
	}
	for _, k := range keys {
		if err := d.scripts.sent.Run(ctx, d.rdb, []string{k}).Err(); err != nil {
			d.log.Warn("minPeriod left running from before the send: a digest may come as early as the send took",
				"channel", job.Channel, "project", job.ProjectID, "error", err)
			return
		}
	}
}

// gather passes firing f of job through its rule's minPeriod gate on the
// channel: gathered false means send it now, true that it waits for the
// digest, whose flush it scheduled if needed; omitted that the digest was
// full and only counts it. The digest keeps the firing as a job of its
// own in the shape of earlier versions (wire.Job.MarshalFlat), which
// flush digests beside this one during an upgrade.
func (d *Deliverer) gather(ctx context.Context, job *wire.Job, f *wire.Firing) (gathered, omitted bool, err error) {
	one := withFirings(job, []wire.Firing{*f})
	body, err := one.MarshalFlat()
	if err != nil {
		return false, false, err
	}
	flush := flushJob(job, f.RuleID, f.MinPeriod)
	k := d.minPeriodKeys(flush)
	raw, err := d.scripts.gate.Run(ctx, d.rdb, []string{k.state, k.pending, k.gathered}, f.MinPeriod, f.Notification.ID, body,
		d.cfg.DigestMaxFirings, d.cfg.DigestMaxBytes).Int64Slice()
	var r gateReply
	if err == nil {
		r, err = decodeGate(raw)
	}
	if err != nil {
		return false, false, fmt.Errorf("minPeriod of rule %s on %s: %w", f.RuleID, job.Channel, err)
	}
	switch r.code {
	case gateSendNow:
		return false, false, nil
	case gateFlushIn:
		if err := d.schedule(ctx, flush, r.flushIn, false); err != nil {
			return false, false, err
		}
	}
	return true, r.omitted, nil
}

// flushJob is the job flushing the digest of rule's minPeriod (ms) on
// job's channel.
func flushJob(job *wire.Job, rule string, minPeriod int64) *wire.Job {
	return &wire.Job{Kind: wire.KindFlush, Channel: job.Channel, Endpoint: job.Endpoint, MinPeriod: minPeriod,
		ProjectID: job.ProjectID, RuleID: rule}
}

// deliverDigest sends what a (rule, channel) gathered during its minPeriod.
func (d *Deliverer) deliverDigest(ctx context.Context, job *wire.Job, token string) error {
	for {
		again, err := d.deliverDigestOnce(ctx, job, token)
		if err != nil || !again {
			return err
		}
		// This job settled a digest that was in flight before it came, and
		// may be the flush that what was gathered since counts on (its
		// sender, finding it gone, has nothing left to do): flush again.
		job = flushJob(job, job.RuleID, job.MinPeriod)
	}
}

// deliverDigestOnce sends the digest in flight, or takes what is pending as
// one. again reports that it settled a digest it did not take itself.
func (d *Deliverer) deliverDigestOnce(ctx context.Context, job *wire.Job, token string) (again bool, err error) {
	k := d.minPeriodKeys(job)
	raw, err := d.scripts.flush.Run(ctx, d.rdb, []string{k.state, k.pending, k.inflight}, job.MinPeriod).Slice()
	var r flushReply
	if err == nil {
		r, err = decodeFlush(raw)
	}
	if err != nil {
		return false, fmt.Errorf("flush digest of rule %s on %s: %w", job.RuleID, job.Channel, err)
	}
	if job.Generation != r.generation {
		// The digest this job retried was settled by another flush job.
		job = flushJob(job, job.RuleID, job.MinPeriod)
	}
	switch r.code {
	case flushTooEarly:
		return false, d.schedule(ctx, job, r.wait, false)
	case flushNothing:
		return false, nil
	}
	job.Generation = r.generation // for its retries
	taken := r.code == flushTaken
	var ns []notify.Notification
	for _, body := range r.jobs {
		pending, err := wire.ParseJob([]byte(body))
		if err != nil || pending.Kind != wire.KindFirings || len(pending.Firings) != 1 || pending.Firings[0].Notification == nil {
			d.log.Error("unusable job in a digest: dropped from it", "rule", job.RuleID, "channel", job.Channel, "error", err)
			continue
		}
		ns = append(ns, *pending.Firings[0].Notification)
	}
	slices.SortFunc(ns, cmpTimeThenID)
	msg := digestMessage(job, ns, r.omitted)
	key := d.digestClaimKey(msg, job.Channel)
	// Once the digest is recorded, its copy in flight goes; a digest this
	// job did not take then asks for another flush (again).
	drop := func() (again bool, err error) {
		if err := d.scripts.drop.Run(ctx, d.rdb, []string{k.inflight}, r.generation).Err(); err != nil {
			return false, fmt.Errorf("drop digest %s in flight: %w", msg.ID, err)
		}
		return !taken, nil
	}
	if ok, err := d.settled(ctx, key); ok {
		if err != nil {
			return false, err
		}
		return drop()
	}
	state, wait, err := d.claim(ctx, key, token)
	if err != nil {
		return false, err
	}
	switch state {
	case done:
		return drop()
	case busy:
		return false, d.schedule(ctx, job, wait, true)
	}
	ctx, cancel := withGrace(ctx, sendGrace)
	defer cancel()
	// A retry keeps the digest in flight, to send the same again.
	if recorded, err := d.deliverMessage(ctx, job, []string{key}, msg); !recorded {
		return false, err
	}
	return drop()
}

// digestClaimKey is the claim key of a digest's message on a channel. A
// digest of one is sent as its firing, with the firing's id, whose own
// claim key already says "digested": its send is recorded under that key
// with ":digest" added. The key strings are kept as they are: a worker of
// the previous version, in a rolling upgrade, records a digest's send there.
func (d *Deliverer) digestClaimKey(m *notify.Message, channel string) string {
	if !m.Digest {
		return d.claimKey(m.ID + ":" + channel + ":digest")
	}
	return d.claimKey(m.ID + ":" + channel)
}

func cmpTimeThenID(a, b notify.Notification) int {
	return cmp.Or(a.FiredAt.Compare(b.FiredAt), strings.Compare(a.ID, b.ID))
}

// digestMessage is one message for the notifications of a digest and the
// count of those it left out: the notification itself when there is one
// alone, else a digest with an id derived from its contents, so a resend
// carries the same id.
func digestMessage(job *wire.Job, ns []notify.Notification, omitted int64) *notify.Message {
	m := &notify.Message{ProjectID: job.ProjectID, RuleID: job.RuleID, Notifications: ns, Omitted: omitted}
	if len(ns) == 1 && omitted == 0 {
		m.ID = ns[0].ID
		return m
	}
	h := sha256.New()
	for _, n := range ns {
		h.Write([]byte(n.ID))
	}
	if omitted > 0 {
		fmt.Fprintf(h, "+%d", omitted)
	}
	m.ID, m.Digest = "digest-"+hex.EncodeToString(h.Sum(nil)[:16]), true
	return m
}
