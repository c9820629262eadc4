package deliverer

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/quiet"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// Quiet hours are held here as snoozes are (snooze.go), with one
// difference: the job says whether a firing is held (wire.Firing.Quiet,
// decided once where the job was made), so every try of it decides alike.
// A held firing is recorded "quiet" under its own claim and kept in one
// hash per destination and end of quiet period; the recap job scheduled
// by the first firing held takes that hash once the period is over
// (quiet_take.lua), after which a firing that comes late is sent on its
// own, so that each firing goes once, in the recap or alone, whatever
// worker is killed when.

// Levels says whether a rule's count for a group is still at one of its
// thresholds, for the recap's "still above threshold". An error or false
// leaves the group out of it.
type Levels interface {
	StillAbove(ctx context.Context, projectID, ruleID, groupHash string) (bool, error)
}

// maxLevelChecks bounds the groups a recap asks Levels about: at most one
// Redis read each, once per recap.
const maxLevelChecks = 100

// Replies of quiet_hold.lua.
const (
	quietHeld     = 0
	quietSchedule = 1
	quietLate     = 2
)

// holdQuiet holds firing f of job, made during quiet period f.Quiet, for
// the period's recap to the job's destination, and records it "quiet".
// held false means send it: the recap was taken without it.
func (d *Deliverer) holdQuiet(ctx context.Context, job *wire.Job, f *wire.Firing, key string) (held bool, err error) {
	n, sp := f.Notification, f.Quiet
	rk, ok := d.recapKey(job, sp)
	if !ok {
		return false, nil // an endpoint that does not open: its send fails it, with the reason
	}
	body, err := json.Marshal(n)
	if err != nil {
		return false, fmt.Errorf("encode notification: %w", err)
	}
	now := d.now()
	ttl := max(sp.Until.Sub(now), 0) + heldFor
	r, err := d.scripts.quietHold.Run(ctx, d.rdb, []string{rk}, n.ID, body, d.cfg.DigestMaxFirings, d.cfg.DigestMaxBytes,
		ttl.Milliseconds(), f.RuleID, sp.Since.UnixMilli()).Int64()
	if err == nil && (r < quietHeld || r > quietLate) {
		err = fmt.Errorf("quiet_hold.lua: unexpected reply %d", r)
	}
	if err != nil {
		return false, fmt.Errorf("hold %s for the quiet period of rule %s: %w", n.ID, f.RuleID, err)
	}
	if r == quietLate {
		d.log.Info("notification sent on its own: its quiet period's recap went without it", "channel", job.Channel,
			"project", job.ProjectID, "rule", f.RuleID, "notification_id", n.ID, "quiet_until", sp.Until)
		return false, nil
	}
	if r == quietSchedule {
		if err := d.schedule(ctx, recapJob(job, sp), max(sp.Until.Sub(now), 0), false); err != nil {
			return false, err
		}
	}
	d.metrics.Notifications.WithLabelValues(job.Channel, "quiet").Inc()
	d.log.Info("notification held: quiet hours", "channel", job.Channel, "project", job.ProjectID,
		"rule", f.RuleID, "notification_id", n.ID, "quiet_until", sp.Until)
	return true, d.record(ctx, key, "quiet")
}

// recapKey is the hash of what a quiet period ending at sp.Until held for
// job's destination: one per destination and end, whatever rules, and
// whatever zones, held firings for it. The endpoint is named by its tag
// (seal.Keys.Tag): it may be a secret.
func (d *Deliverer) recapKey(job *wire.Job, sp *quiet.Span) (string, bool) {
	endpoint, err := d.cfg.Keys.Open(job.Endpoint, job.ProjectID, job.Channel)
	if err != nil {
		return "", false
	}
	return d.cfg.Prefix + ":quiet:" + job.ProjectID + ":" + strconv.FormatInt(sp.Until.UnixMilli(), 10) + ":" +
		paceKey(job.Channel, d.cfg.Keys.Tag(endpoint)), true
}

// recapJob is the job that sends, once quiet period sp ended, what it
// held for job's destination.
func recapJob(job *wire.Job, sp *quiet.Span) *wire.Job {
	return &wire.Job{Kind: wire.KindQuiet, Channel: job.Channel, Endpoint: job.Endpoint, ProjectID: job.ProjectID, Quiet: sp}
}

// heldRecap is what quiet_take.lua read.
type heldRecap struct {
	notifications []notify.Notification
	omitted       int64
	total         int64
	byRule        map[string]int64
	since         time.Time
	sent          bool
	above         []ruleGroup // cached answer of Levels; nil when not asked yet
}

type ruleGroup struct {
	Rule  string `json:"r"`
	Group string `json:"g"`
}

// deliverRecap sends what a quiet period held for a destination, as one
// digest with an id derived from the destination and the period's end,
// once the period is over; until then it comes back.
func (d *Deliverer) deliverRecap(ctx context.Context, job *wire.Job, token string) error {
	sp := job.Quiet
	if now := d.now(); now.Before(sp.Until) {
		return d.schedule(ctx, job, sp.Until.Sub(now), false)
	}
	rk, ok := d.recapKey(job, sp)
	if !ok {
		d.log.Error("quiet recap with an endpoint that does not open: nothing was held for it", "channel", job.Channel, "project", job.ProjectID)
		return nil
	}
	raw, err := d.scripts.quietTake.Run(ctx, d.rdb, []string{rk}, heldFor.Milliseconds()).StringSlice()
	if err != nil {
		return fmt.Errorf("take the recap of quiet period ending %s: %w", sp.Until.Format(time.RFC3339), err)
	}
	h, err := decodeRecap(raw)
	if err != nil {
		return err
	}
	if h.sent || h.total == 0 {
		return nil // sent by an earlier job, or nothing held
	}
	if h.above == nil {
		if h.above, err = d.stillAbove(ctx, rk, job.ProjectID, h.notifications); err != nil {
			return err
		}
	}
	sum := sha256.Sum256([]byte(rk))
	msg := recapMessage("quiet-"+hex.EncodeToString(sum[:16]), job.ProjectID, sp, h)
	return d.deliverOnce(ctx, job, d.claimKey(msg.ID+":"+job.Channel), token, msg, func(ctx context.Context) error {
		if err := d.scripts.quietDone.Run(ctx, d.rdb, []string{rk}, d.cfg.Keep.Milliseconds()).Err(); err != nil {
			return fmt.Errorf("drop what the quiet period held for recap %s: %w", msg.ID, err)
		}
		return nil
	})
}

// decodeRecap reads quiet_take.lua's reply.
func decodeRecap(raw []string) (heldRecap, error) {
	h := heldRecap{byRule: map[string]int64{}}
	if len(raw)%2 != 0 {
		return h, fmt.Errorf("quiet_take.lua: a field without a value")
	}
	num := func(v string) int64 { n, _ := strconv.ParseInt(v, 10, 64); return n }
	for i := 0; i < len(raw); i += 2 {
		f, v := raw[i], raw[i+1]
		switch {
		case f == "#omitted":
			h.omitted = num(v)
		case f == "#total":
			h.total = num(v)
		case f == "#since":
			h.since = time.UnixMilli(num(v))
		case f == "#sent":
			h.sent = true
		case f == "#above":
			if err := json.Unmarshal([]byte(v), &h.above); err != nil {
				h.above = nil // asked again
			} else if h.above == nil {
				h.above = []ruleGroup{}
			}
		case strings.HasPrefix(f, "#"):
		case strings.HasPrefix(f, "r:"):
			h.byRule[f[2:]] = num(v)
		case v == "": // counted, not listed
		default:
			var n notify.Notification
			if err := json.Unmarshal([]byte(v), &n); err != nil {
				h.omitted++ // unusable: counted, not listed
				continue
			}
			h.notifications = append(h.notifications, n)
		}
	}
	slices.SortFunc(h.notifications, cmpTimeThenID)
	return h, nil
}

// stillAbove asks Levels which groups of the recap's threshold firings
// are still at a threshold, at most maxLevelChecks of them, and keeps the
// answer with the recap, so that a retry sends the same message.
func (d *Deliverer) stillAbove(ctx context.Context, rk, projectID string, ns []notify.Notification) ([]ruleGroup, error) {
	above := []ruleGroup{}
	if d.cfg.Levels != nil {
		seen := map[ruleGroup]bool{}
		for _, n := range ns {
			rg := ruleGroup{n.RuleID, n.Event.GroupHash}
			if n.Type != notify.TypeThreshold || seen[rg] || len(seen) == maxLevelChecks {
				continue
			}
			seen[rg] = true
			ok, err := d.cfg.Levels.StillAbove(ctx, projectID, rg.Rule, rg.Group)
			if err != nil {
				d.log.Warn("quiet recap: could not tell whether a group is still above its threshold; left out",
					"project", projectID, "rule", rg.Rule, "error", err)
				continue
			}
			if ok {
				above = append(above, rg)
			}
		}
	}
	body, err := json.Marshal(above)
	if err != nil {
		return nil, fmt.Errorf("encode groups above threshold: %w", err)
	}
	if err := d.rdb.HSetNX(ctx, rk, "#above", body).Err(); err != nil {
		return nil, fmt.Errorf("keep the recap's groups above threshold: %w", err)
	}
	// Another worker's answer may have come first: send that one.
	v, err := d.rdb.HGet(ctx, rk, "#above").Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read the recap's groups above threshold: %w", err)
	}
	if err == nil && json.Unmarshal(v, &above) != nil {
		return nil, fmt.Errorf("read the recap's groups above threshold: not JSON")
	}
	return above, nil
}

// recapMessage is the recap of what h held during quiet period sp.
func recapMessage(id, projectID string, sp *quiet.Span, h heldRecap) *notify.Message {
	since := sp.Since
	if !h.since.IsZero() && h.since.Before(since) {
		since = h.since.In(sp.Until.Location())
	}
	r := &notify.Recap{Since: since, Until: sp.Until, Timezone: sp.Timezone, Firings: h.total}
	for rule, n := range h.byRule {
		r.Rules = append(r.Rules, notify.RecapRule{RuleID: rule, Firings: n, StillAbove: []string{}})
	}
	slices.SortFunc(r.Rules, func(a, b notify.RecapRule) int {
		return cmp.Or(cmp.Compare(b.Firings, a.Firings), strings.Compare(a.RuleID, b.RuleID))
	})
	for _, rg := range h.above {
		for i := range r.Rules {
			if r.Rules[i].RuleID == rg.Rule {
				r.Rules[i].StillAbove = append(r.Rules[i].StillAbove, rg.Group)
				r.StillAbove++
			}
		}
	}
	m := &notify.Message{ID: id, ProjectID: projectID, Digest: true, Notifications: h.notifications,
		Omitted: h.omitted, Quiet: r}
	if len(r.Rules) == 1 {
		m.RuleID = r.Rules[0].RuleID
	}
	return m
}
