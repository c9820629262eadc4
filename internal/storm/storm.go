// Package storm sends "storm over" messages: after a SEEN_MORE firing of a
// rule that asks for them, one message once the window that fired has
// stayed below its threshold for a whole period, saying how long the storm
// lasted and how many events it had (docs/contract.md §4.7).
//
// A firing starts a storm for its (project, rule, group, window) unless one
// is active; later firings belong to it. The storm lives in Redis: a record
// with what its looks at the window's ring saw (history), and a member of a
// sorted set scored by when to look next. Every worker that evaluates
// sweeps that set; a due storm is claimed by pushing its score a lease
// ahead, so one worker at a time checks it, and a worker killed mid-check
// only delays it by the lease. The end is decided (the message written into
// the record) before its delivery jobs are published: a worker killed in
// between leaves a record that the next one publishes as it is, with the
// same id, and the deliverer sends each job once.
package storm

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/quiet"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/seal"
	"github.com/klaxonhq/klaxon/internal/wire"
)

//go:embed start.lua
var startLua string

//go:embed claim.lua
var claimLua string

//go:embed save.lua
var saveLua string

// Rings reads a window's ring of buckets (counter.Engine.Ring).
type Rings interface {
	Ring(ctx context.Context, projectID, groupHash string, r *rules.Rule, w int) (counter.Ring, error)
}

// Rules gives a project's current rules (store.Cache).
type Rules interface {
	Matcher(projectID string) *rules.Matcher
	Ready() bool
}

// Publisher publishes messages and returns once the broker confirmed them.
type Publisher interface {
	Publish(ctx context.Context, msgs ...queue.Message) error
}

// Config configures a Tracker.
type Config struct {
	Redis     redis.UniversalClient
	Prefix    string // KLAXON_PREFIX
	Rings     Rings
	Rules     Rules
	Publisher Publisher
	// DeliveryQueue receives the messages' delivery jobs.
	DeliveryQueue string
	// Keys seal the endpoints of a decided message's record and jobs
	// (KLAXON_ENDPOINT_KEY); nil leaves them in clear.
	Keys *seal.Keys
	// All turns storm-over messages on for every rule that does not say
	// (KLAXON_STORM_OVER).
	All bool
	// Poll is how often a worker looks for due storms [200ms]: well under
	// the shortest period (1 s), since looks must stay under a period apart.
	Poll time.Duration
	// Lease is how long a claimed storm is left to the worker that claimed
	// it [1m]: a worker killed mid-check delays its storms by this much.
	Lease   time.Duration
	Log     *slog.Logger
	Metrics *metrics.Metrics
}

// Tracker starts storms at firings and ends them with a message.
type Tracker struct {
	cfg                 Config
	start, claim, store *redis.Script
}

// New returns a tracker.
func New(cfg Config) *Tracker {
	if cfg.Poll <= 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	if cfg.Lease <= 0 {
		cfg.Lease = time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Tracker{cfg: cfg, start: redis.NewScript(startLua), claim: redis.NewScript(claimLua), store: redis.NewScript(saveLua)}
}

// seenFor is how long a firing is remembered as having started (or
// joined) a storm, so that a redelivered message's replayed firing does not
// start a storm again after its storm ended.
const seenFor = 24 * time.Hour

// claimBatch bounds the storms one sweep claims.
const claimBatch = 32

// record is a storm as stored in Redis.
type record struct {
	ID        string `json:"id"` // the first firing's id
	ProjectID string `json:"projectId"`
	RuleID    string `json:"ruleId"`
	GroupHash string `json:"groupHash"`
	Window    int    `json:"window"`
	// First is the first firing's message, for the title and link.
	First   notify.Notification `json:"first"`
	History *history            `json:"history"`
	// Over is the decided message, once the storm ended; Channels are
	// where it goes, as the rule said then, and Quiet the rule's quiet
	// period it is held for then, if any.
	Over     *notify.Notification `json:"over,omitempty"`
	Channels []rules.Channel      `json:"channels,omitempty"`
	Quiet    *quiet.Span          `json:"quiet,omitempty"`
}

// OverID is the id of the message that ends the storm started by firing
// id: 32 hex digits, the same on every channel and at every try.
func OverID(firingID string) string {
	sum := sha256.Sum256([]byte("storm-over\x00" + firingID))
	return hex.EncodeToString(sum[:16])
}

func (t *Tracker) key(parts ...string) string {
	k := t.cfg.Prefix + ":{storms}" // one slot: the scripts touch several keys
	for _, p := range parts {
		k += ":" + p
	}
	return k
}

func (t *Tracker) dueKey() string             { return t.key("due") }
func (t *Tracker) recordKey(id string) string { return t.key("s", id) }
func (t *Tracker) seenKey(id string) string   { return t.key("f", id) }
func (t *Tracker) activeKey(r *record) string {
	return activeKey(t, r.ProjectID, r.RuleID, r.GroupHash, r.Window)
}

func activeKey(t *Tracker, projectID, ruleID, groupHash string, w int) string {
	sum := sha256.Sum256([]byte(projectID + "\x00" + ruleID + "\x00" + groupHash + "\x00" + strconv.Itoa(w)))
	return t.key("a", hex.EncodeToString(sum[:12]))
}

// Wants says whether firings of r start storms.
func (t *Tracker) Wants(r *rules.Rule) bool { return r.WantsStormOver(t.cfg.All) }

// Start records firing n of rule r's window w: it starts a storm unless
// one is active for the rule, group and window (the firing then belongs to
// it) or the firing was recorded before (a replay). It reads the window's
// ring first, so that the storm knows the window that fired.
func (t *Tracker) Start(ctx context.Context, r *rules.Rule, w int, n *notify.Notification) error {
	ring, err := t.cfg.Rings.Ring(ctx, n.ProjectID, n.Event.GroupHash, r, w)
	if err != nil {
		return fmt.Errorf("start storm of %s: %w", n.ID, err)
	}
	h := newHistory(n.FiredAt.UnixMilli(), n.Count, r.Windows[w].Period.Milliseconds(), ring.Bucket.Milliseconds())
	now := ring.Now.UnixMilli()
	h.observe(now, ring.At.UnixMilli(), ring.Counts, r.Windows[w].Threshold)
	rec := record{ID: n.ID, ProjectID: n.ProjectID, RuleID: r.ID, GroupHash: n.Event.GroupHash, Window: w, First: *n, History: h}
	rec.First.History, rec.First.Version = nil, ""
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode storm %s: %w", n.ID, err)
	}
	active := t.activeKey(&rec)
	res, err := t.start.Run(ctx, t.cfg.Redis, []string{t.dueKey(), active, t.seenKey(n.ID), t.recordKey(n.ID), active + ":last"},
		n.ID, data, h.next(now), seenFor.Milliseconds(), n.FiredAt.UnixMilli()).Int64()
	if err != nil {
		return fmt.Errorf("start storm of %s: %w", n.ID, err)
	}
	if res == 2 {
		t.cfg.Metrics.Storms.WithLabelValues("started").Inc()
		t.cfg.Log.Info("storm started", "project", n.ProjectID, "rule", r.ID, "group", n.Event.GroupHash,
			"window", w, "storm_id", n.ID)
	}
	return nil
}

// Run sweeps due storms until ctx ends.
func (t *Tracker) Run(ctx context.Context) error {
	tick := time.NewTicker(t.cfg.Poll)
	defer tick.Stop()
	failing := false
	for {
		err := t.Sweep(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !failing:
			failing = true
			t.cfg.Log.Warn("storm checks failing; trying again", "error", err)
		case err == nil && failing:
			failing = false
			t.cfg.Log.Info("storm checks back")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Sweep claims the storms that are due and checks each. A check that fails
// is left to its lease: another sweep, here or elsewhere, tries it again.
func (t *Tracker) Sweep(ctx context.Context) error {
	if !t.cfg.Rules.Ready() {
		return nil // no rules yet: a storm's rule would look deleted
	}
	reply, err := t.claim.Run(ctx, t.cfg.Redis, []string{t.dueKey()}, t.cfg.Lease.Milliseconds(), claimBatch).StringSlice()
	if err != nil {
		t.cfg.Metrics.Storms.WithLabelValues("error").Inc()
		return fmt.Errorf("claim due storms: %w", err)
	}
	if len(reply) < 1 {
		return fmt.Errorf("claim due storms: empty reply")
	}
	lease := reply[0]
	var first error
	for _, id := range reply[1:] {
		cctx, cancel := context.WithTimeout(ctx, t.cfg.Lease/2)
		err := t.check(cctx, id, lease)
		cancel()
		if err != nil {
			t.cfg.Metrics.Storms.WithLabelValues("error").Inc()
			t.cfg.Log.Warn("storm check failed; tried again when its lease ends", "storm_id", id, "error", err)
			if first == nil {
				first = err
			}
		}
	}
	return first
}

// check looks at one claimed storm: ends it, or says when to look next.
func (t *Tracker) check(ctx context.Context, id, lease string) error {
	raw, err := t.cfg.Redis.Get(ctx, t.recordKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		_, err = t.save(ctx, id, lease, nil, "", false) // a member without a record: nothing to end
		return err
	}
	if err != nil {
		return fmt.Errorf("read storm %s: %w", id, err)
	}
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil || rec.History == nil {
		t.cfg.Metrics.Storms.WithLabelValues("dropped").Inc()
		t.cfg.Log.Error("storm record unreadable: dropped", "storm_id", id, "error", err)
		_, err = t.save(ctx, id, lease, nil, "", false)
		return err
	}
	if rec.Over == nil {
		r, why := t.rule(&rec)
		if r == nil {
			t.cfg.Metrics.Storms.WithLabelValues("dropped").Inc()
			t.cfg.Log.Warn("storm dropped: no message", "project", rec.ProjectID, "rule", rec.RuleID,
				"group", rec.GroupHash, "storm_id", id, "reason", why)
			_, err := t.save(ctx, id, lease, &rec, "", true)
			return err
		}
		ring, err := t.cfg.Rings.Ring(ctx, rec.ProjectID, rec.GroupHash, r, rec.Window)
		if err != nil {
			return err
		}
		h, now := rec.History, ring.Now.UnixMilli()
		h.observe(now, ring.At.UnixMilli(), ring.Counts, r.Windows[rec.Window].Threshold)
		if !h.over(now) {
			_, err := t.save(ctx, id, lease, &rec, strconv.FormatInt(h.next(now), 10), false)
			return err
		}
		over := overMessage(&rec, r)
		rec.Over, rec.Channels, rec.Quiet = &over, t.sealed(rec.ProjectID, r.Channels), r.QuietAt(ring.Now)
		// Decided: written before anything is published, so that whoever
		// publishes it publishes this one message.
		res, err := t.write(ctx, id, lease, &rec, lease, true, strconv.FormatInt(h.Loud, 10))
		if err != nil || res == lostLease {
			return err
		}
		if res == joined {
			t.cfg.Log.Debug("a firing joined the storm as it ended: looking again", "storm_id", id)
			return nil
		}
	}
	msgs, err := wire.Deliveries(t.cfg.DeliveryQueue, rec.ProjectID, &rules.Rule{ID: rec.RuleID, Channels: rec.Channels}, rec.Over, rec.Quiet)
	if err != nil {
		return err
	}
	if err := t.cfg.Publisher.Publish(ctx, msgs...); err != nil {
		return fmt.Errorf("publish storm over %s: %w", rec.Over.ID, err)
	}
	if ok, err := t.save(ctx, id, lease, &rec, "", true); err != nil || !ok {
		return err // another worker holds it now, and publishes the same jobs
	}
	st := rec.Over.Storm
	t.cfg.Metrics.Storms.WithLabelValues("over").Inc()
	t.cfg.Log.Info("storm over", "project", rec.ProjectID, "rule", rec.RuleID, "group", rec.GroupHash,
		"storm_id", id, "notification_id", rec.Over.ID, "events", st.Events, "duration_ms", st.Duration,
		"exact", st.Exact, "channels", len(rec.Channels))
	return nil
}

// rule is the storm's rule as it is now, or nil and why not: a rule that
// was deleted, disabled, no longer asks for the message, or whose window
// changed (its ring counts something else now) ends the storm without one.
func (t *Tracker) rule(rec *record) (*rules.Rule, string) {
	for _, r := range t.cfg.Rules.Matcher(rec.ProjectID).Rules() {
		if r.ID != rec.RuleID {
			continue
		}
		switch {
		case !t.Wants(r):
			return nil, "the rule no longer asks for storm-over messages"
		case rec.Window >= len(r.Windows) || r.Windows[rec.Window].Period.Milliseconds() != rec.History.Period:
			return nil, "the window that fired was changed"
		}
		return r, ""
	}
	return nil, "the rule was deleted or disabled"
}

// save writes the record back and schedules its next look at next (Unix
// ms), or, with next "", deletes it; end frees the storm's rule, group and
// window for a new storm. It does nothing, and says false, if the worker's
// lease was lost: another worker holds the storm.
func (t *Tracker) save(ctx context.Context, id, lease string, rec *record, next string, end bool) (bool, error) {
	res, err := t.write(ctx, id, lease, rec, next, end, "")
	return res == 1, err
}

// Replies of save.lua.
const (
	lostLease = 0
	saved     = 1
	joined    = 2 // a firing joined the storm after it fell quiet
)

// write is save, and with quiet (when the storm fell quiet, Unix ms) the
// end of a storm found over, refused (joined) if a firing joined it since.
func (t *Tracker) write(ctx context.Context, id, lease string, rec *record, next string, end bool, quiet string) (int64, error) {
	var data []byte
	active := t.key("none")
	if rec != nil {
		var err error
		if data, err = json.Marshal(rec); err != nil {
			return lostLease, fmt.Errorf("encode storm %s: %w", id, err)
		}
		active = t.activeKey(rec)
	}
	endFlag := "0"
	if end {
		endFlag = "1"
	}
	res, err := t.store.Run(ctx, t.cfg.Redis, []string{t.dueKey(), t.recordKey(id), active, active + ":last"},
		id, lease, data, next, endFlag, quiet, 0).Int64()
	if err != nil {
		return lostLease, fmt.Errorf("save storm %s: %w", id, err)
	}
	if res == lostLease {
		t.cfg.Log.Warn("storm lease lost: another worker checks it", "storm_id", id)
	}
	return res, nil
}

// overMessage is the message that ends the storm.
func overMessage(rec *record, r *rules.Rule) notify.Notification {
	h := rec.History
	events := h.events()
	w := r.Windows[rec.Window]
	return notify.Notification{
		ID: OverID(rec.ID), Type: notify.TypeStormOver,
		ProjectID: rec.ProjectID, ProjectName: r.ProjectName,
		RuleID: r.ID, RuleDescription: r.Description,
		Event: rec.First.Event,
		Count: events, Threshold: w.Threshold, Period: w.Period.Milliseconds(), CountBy: rules.CountEvents,
		FiredAt: time.UnixMilli(h.Loud + h.Period).UTC(),
		Windows: []notify.WindowStatus{},
		Storm: &notify.Storm{
			FiringID:   rec.ID,
			StartedAt:  time.UnixMilli(h.Start).UTC(),
			QuietSince: time.UnixMilli(h.Loud).UTC(),
			Duration:   h.Loud - h.Start,
			Events:     events,
			Exact:      !h.Inexact,
		},
	}
}

// sealed is channels with their endpoints sealed: a decided message's
// record keeps them in Redis until its jobs are published.
func (t *Tracker) sealed(project string, cs []rules.Channel) []rules.Channel {
	out := slices.Clone(cs)
	for i := range out {
		out[i].Endpoint = t.cfg.Keys.Seal(out[i].Endpoint, project, out[i].Name)
	}
	return out
}
