// Package evaluator is the first stage of the worker: it takes a batch of
// incoming events, matches them against their project's rules, counts them
// and turns every firing into delivery jobs, so that a batch is acked only
// once everything it caused is durable.
package evaluator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/hawkdb"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/quiet"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/seal"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// Rules gives the matcher of a project's enabled rules (nil for none); the
// hot path calls it per event. Before the first load (the store unreachable
// at start) it is not Ready: "no rules" then means "not known yet", not
// "none".
type Rules interface {
	Matcher(projectID string) *rules.Matcher
	Ready() bool
}

// ErrRulesNotLoaded holds a batch while no rules were ever loaded: acking
// its events as "project without rules" would lose them.
var ErrRulesNotLoaded = errors.New("no rules loaded yet: holding events until the rule store answers")

// Counter counts events against the rules they matched. token names the
// batch, the same at every attempt, so that an attempt whose writes landed
// though it failed is not counted again.
type Counter interface {
	ObserveBatch(ctx context.Context, token int64, events []counter.Event) ([]counter.Result, error)
}

// Publisher publishes messages and returns once the broker confirmed them.
type Publisher interface {
	Publish(ctx context.Context, msgs ...queue.Message) error
}

// Groups says what Hawk's events database knows of an event group
// (hawkdb.Reader: cached, each read bounded). An error means "unknown":
// the event is handled as if the database were not configured.
type Groups interface {
	Group(ctx context.Context, projectID, groupHash string) (hawkdb.Group, error)
}

// Storms follows the storms that SEEN_MORE firings start, for their
// "storm over" messages (storm.Tracker).
type Storms interface {
	Wants(r *rules.Rule) bool
	Start(ctx context.Context, r *rules.Rule, window int, n *notify.Notification) error
}

// Starved is told of rules that saw events they cannot count: a countBy
// users rule and events without event.user (starved.Watch).
type Starved interface {
	Saw(ctx context.Context, projectID string, r *rules.Rule, reason string, events int)
}

// Evaluator handles batches of incoming events.
type Evaluator struct {
	Rules     Rules
	Counter   Counter
	Publisher Publisher
	// Groups, when set, gives messages the group's history, fires
	// ONLY_NEW rules again for a group that comes back after it was
	// resolved, silences groups marked ignored, and gives isNew events
	// their first occurrence's time and user (contract §4.6).
	Groups Groups
	// Repetitions, when set, gives the events of projects with a countBy
	// users rule that lack event.user their repetition's user and time
	// (fromhawk.go).
	Repetitions Repetitions
	// DeadQueue receives messages that cannot be used (<queue>.dead).
	DeadQueue string
	// DeliveryQueue receives, per event, one job per destination (more
	// when they would be over wire.MaxJobBytes).
	DeliveryQueue string
	// FailedQueue receives the firings too big for any delivery job
	// (<prefix>.failed).
	FailedQueue string
	// Lanes, when set, send a project's jobs past its share of the
	// delivery queue to the bulk lane (lanes.go).
	Lanes *Lanes
	// EventURL makes the link to an event that messages carry
	// (KLAXON_EVENT_URL, KLAXON_EVENT_URL_FALLBACK); the event's id is the
	// group document's _id that Groups read.
	EventURL Link
	// Storms, when set, is told of every firing of a rule that wants
	// "storm over" messages.
	Storms Storms
	// Starved, when set, is told of the batch's rules that saw events
	// they cannot count.
	Starved Starved
	// Live, when set, bounds the groups a project keeps a state for.
	Live LiveGroups
	// Keys seal the endpoint in each delivery job (KLAXON_ENDPOINT_KEY);
	// nil leaves it in clear.
	Keys    *seal.Keys
	Log     *slog.Logger
	Metrics *metrics.Metrics
	// Now is the clock quiet hours are told by [time.Now]: the wall
	// clock people keep them by, not the events' times.
	Now func() time.Time

	// counting lets one batch at a time count: batches of one worker
	// handled at once (queue.ConsumerConfig.Concurrency) decode, match and
	// publish side by side, but two counting at once would read the same
	// groups' states and lose the compare-and-set to each other, sending
	// both to the script.
	counting sync.Mutex
	// brokerMax is the broker's max_message_size once a refusal told it
	// (0 before): jobs are built within it from then on.
	brokerMax atomic.Int64
}

// Handle processes a batch; returning nil acks all of it. Dead letters and
// delivery jobs are confirmed by the broker before Handle returns. On error
// nothing is acked and the same batch comes again: counting is idempotent by
// message id, and delivery jobs carry deterministic ids.
func (e *Evaluator) Handle(ctx context.Context, b *queue.Batch) error {
	if !e.Rules.Ready() {
		return ErrRulesNotLoaded
	}
	var (
		out    []queue.Message
		events = make([]counter.Event, 0, len(b.Deliveries))
		msgs   = make([]event.Message, 0, len(b.Deliveries)) // parallel to events
		// matched holds every event's matched rules back to back; each
		// event's Rules is a full slice expression of it, so appending
		// for the next event never writes into an earlier one's.
		matched  []*rules.Rule
		tally    tally
		pending  = make([]pendingEvent, 0, len(b.Deliveries))
		starving starvation
	)
	for i := range b.Deliveries {
		d := &b.Deliveries[i]
		m, err := event.Decode(d.Body)
		if err != nil {
			dl := d.Message(e.DeadQueue)
			dl.Headers[wire.ErrorHeader] = err.Error()
			out = append(out, dl)
			tally[outDead]++
			e.Log.Warn("dead-lettered a message", "queue", e.DeadQueue, "message_id", d.MessageID, "error", err)
			continue
		}
		matcher := e.Rules.Matcher(m.ProjectID)
		if matcher.Len() == 0 {
			tally[outNoRules]++
			continue
		}
		pending = append(pending, pendingEvent{d: d, m: m, matcher: matcher})
	}

	groups := e.lookupGroups(ctx, pending)
	e.fromHawk(ctx, pending, groups)
	var regs regressions
	for i := range pending {
		d, m, matcher := pending[i].d, pending[i].m, pending[i].matcher
		g, known := groups[groupKey{m.ProjectID, m.Event.GroupHash}]
		if known && g.Ignored {
			tally[outUnmatched]++ // people asked not to hear of it
			continue
		}
		// One pass over the title for all of the project's words: a
		// project's filters cannot make its events cost more than their
		// titles' length.
		first := len(matched)
		matched = matcher.Match(m.Event.Title, m.Event.IsNew, matched)
		if known && g.Resolved != 0 && !m.Event.IsNew {
			matched = regs.add(matcher, m.Event.Title, g.Resolved, matched)
		}
		if len(matched) == first {
			tally[outUnmatched]++
			continue
		}
		userID := m.Event.UserID()
		if userID == "" {
			starving.add(matched[first:])
		}
		events = append(events, counter.Event{
			// Every event with an identity is looked up by it, first
			// deliveries included: a producer publishes again what the
			// broker did not confirm, and a batch tried again may have been
			// counted by a try whose reply was lost. Without one, every
			// delivery counts (see README, Duplicates).
			ID:          identity(d, &m),
			Body:        d.Body,
			Redelivered: d.Redelivered,
			ProjectID:   m.ProjectID,
			GroupHash:   m.Event.GroupHash,
			UserID:      userID,
			Time:        m.Event.Time(),
			Rules:       matched[first:len(matched):len(matched)],
		})
		msgs = append(msgs, m)
	}

	var results []counter.Result
	over, err := e.overflow(ctx, events, &regs)
	if err != nil {
		return err
	}
	if len(events) > 0 {
		e.counting.Lock()
		results, err = e.observe(ctx, b.ID, over)
		e.counting.Unlock()
		if err != nil {
			return fmt.Errorf("count %d events: %w", len(events), err)
		}
		e.sawGroups(over, results)
		// The next batch may count while this one publishes and waits for
		// the broker's confirms (queue.ConsumerConfig.Pipelined); not after
		// a failure, which the next would meet too.
		b.Release()
	}
	if err := e.publish(ctx, out, events, msgs, results, groups, &regs); err != nil {
		return err
	}
	if err := e.startStorms(ctx, over.counted, msgs, results, groups); err != nil {
		return err
	}
	e.tellStarved(ctx, starving)
	e.record(tally, events, results, &regs)
	return nil
}

// publish publishes the batch's dead letters and the delivery jobs of its
// firings, and returns once the broker confirmed them all. A message the
// broker refuses for its size would be refused at every try of the batch:
// the broker's refusal says its max_message_size, and the messages are
// built again within it.
func (e *Evaluator) publish(ctx context.Context, dead []queue.Message, evs []counter.Event, msgs []event.Message,
	results []counter.Result, groups map[groupKey]hawkdb.Group, regs *regressions) error {
	brokerMax := int(e.brokerMax.Load()) // 0: not known
	for {
		limit, out := wire.MaxJobBytes, dead
		if brokerMax > 0 {
			// Dead letters are the incoming messages as they came, which
			// the broker took: only a broker set lower since refuses one.
			limit, out = min(limit, brokerMax), cutDeadLetters(dead, brokerMax)
		}
		var big []tooBig
		for i, res := range results {
			jobs, b, err := e.jobs(&evs[i], &msgs[i], res, groups, regs, limit)
			if err != nil {
				return err
			}
			e.Lanes.route(evs[i].ProjectID, e.DeliveryQueue, jobs)
			out, big = append(out, jobs...), append(big, b...)
		}
		for _, t := range big {
			msg, err := e.failed(t, limit)
			if err != nil {
				return err
			}
			out = append(out, msg)
		}
		if len(out) == 0 {
			return nil
		}
		err := e.Publisher.Publish(ctx, out...)
		if tl, ok := errors.AsType[*queue.TooLargeError](err); ok && (brokerMax == 0 || tl.Max < brokerMax) {
			// Each try learns a smaller limit, or is the last.
			brokerMax = tl.Max
			e.brokerMax.Store(int64(tl.Max))
			e.Log.Warn("the broker refused a message over its max_message_size: building messages within it",
				"max_message_size", tl.Max, "job_limit", min(wire.MaxJobBytes, tl.Max))
			continue
		}
		if err != nil {
			return fmt.Errorf("publish %d dead letters and delivery jobs: %w", len(out), err)
		}
		for _, t := range big {
			// Once, now that the batch is done: a batch tried again
			// would count it again otherwise.
			e.Metrics.Notifications.WithLabelValues(t.job.Channel, "failed").Inc()
			e.Log.Error("firing too big for a delivery job: sent to the failed queue", "project", t.job.ProjectID,
				"rule", cut(t.job.Rule()), "channel", t.job.Channel, "notification_id", t.job.Firings[0].Notification.ID,
				"bytes", t.size, "limit", limit, "queue", e.FailedQueue)
		}
		return nil
	}
}

// startStorms tells Storms of the batch's firings that want a "storm
// over" message, replays included: a batch that failed after counting
// comes back with its firings replayed, and Storms knows the ones it saw.
func (e *Evaluator) startStorms(ctx context.Context, events []counter.Event, msgs []event.Message, results []counter.Result, groups map[groupKey]hawkdb.Group) error {
	if e.Storms == nil {
		return nil
	}
	for i, res := range results {
		for k := range res.Outcomes {
			o := &res.Outcomes[k]
			if !o.Fired || o.Window < 0 || !e.Storms.Wants(o.Rule) {
				continue
			}
			n := Notification(&events[i], &msgs[i], o)
			real := msgs[i].Event.GroupHash
			n.Event.URL = e.EventURL.URL(events[i].ProjectID, real, groups[groupKey{events[i].ProjectID, real}].ID)
			// A storm follows the group counted: livegroups.Overflow for
			// a full project's events of groups without a state.
			n.Event.GroupHash = events[i].GroupHash
			if err := e.Storms.Start(ctx, o.Rule, o.Window, &n); err != nil {
				return fmt.Errorf("follow the storm of firing %s: %w", o.ID, err)
			}
		}
	}
	return nil
}

// jobs turns the firings of one event into delivery jobs: one per
// destination (a channel and an endpoint), carrying every rule's firing
// that goes there (docs/contract.md §5.8), or several when one would be
// over limit bytes (pack); it returns the firings too big for any job. A
// replayed firing (a redelivered message) gets the same jobs again; the
// deliverer sends each firing once per channel, whichever job carries it.
//
// With Hawk's events database, a firing carries the group's history as the
// batch read it; a firing of a derived rule is the regression of its rule,
// sent as that rule's (its id, channels and digests).
//
// A firing of a rule in quiet hours carries its quiet period, told by
// e.Now: the deliverer holds it for the period's recap (docs/contract.md
// §4.8).
func (e *Evaluator) jobs(ev *counter.Event, m *event.Message, res counter.Result, groups map[groupKey]hawkdb.Group,
	regs *regressions, limit int) ([]queue.Message, []tooBig, error) {
	type destination struct{ channel, endpoint string }
	var (
		order []destination
		to    = make(map[destination][]wire.Firing)
		now   time.Time
	)
	for k := range res.Outcomes {
		o := &res.Outcomes[k]
		if !o.Fired {
			continue
		}
		n := Notification(ev, m, o)
		g, known := groups[groupKey{ev.ProjectID, ev.GroupHash}]
		n.Event.URL = e.EventURL.URL(ev.ProjectID, ev.GroupHash, g.ID)
		rule := o.Rule
		if reg, ok := regs.lookup(o.Rule); ok {
			rule = reg.rule
			n.Type, n.RuleID = notify.TypeRegressed, rule.ID
			n.ResolvedAt = time.Unix(reg.resolved, 0).UTC()
		}
		if known {
			n.History = history(g, &n)
		}
		var held *quiet.Span
		if rule.Quiet != nil {
			if now.IsZero() {
				now = e.now()
			}
			held = rule.QuietAt(now)
		}
		for _, c := range rule.Channels {
			dest := destination{c.Name, c.Endpoint}
			if _, ok := to[dest]; !ok {
				order = append(order, dest)
			}
			to[dest] = append(to[dest], wire.Firing{RuleID: rule.ID, MinPeriod: c.MinPeriod.Milliseconds(), Notification: &n, Quiet: held})
		}
	}
	jobs := make([]queue.Message, 0, len(order))
	var big []tooBig
	for _, dest := range order {
		base := wire.Job{Kind: wire.KindFirings, Channel: dest.channel,
			Endpoint: e.Keys.Seal(dest.endpoint, ev.ProjectID, dest.channel), ProjectID: ev.ProjectID}
		msgs, b, err := e.pack(base, to[dest], limit)
		if err != nil {
			return nil, nil, err
		}
		jobs, big = append(jobs, msgs...), append(big, b...)
	}
	return jobs, big, nil
}

func (e *Evaluator) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// Notification describes a firing as the webhook body of docs/contract.md §5.1.
func Notification(ev *counter.Event, m *event.Message, o *counter.Outcome) notify.Notification {
	r := o.Rule
	n := notify.Notification{
		ID:              o.ID,
		ProjectID:       ev.ProjectID,
		ProjectName:     r.ProjectName, // from the rules snapshot: no lookup per event
		RuleID:          r.ID,
		RuleDescription: r.Description,
		Event: notify.Event{
			Title:        m.Event.ShortTitle(), // rules matched it whole
			GroupHash:    m.Event.GroupHash,
			RepetitionID: m.Event.ShortRepetitionID(), // bounded, like the title
		},
		FiredAt: o.At.UTC(),
		Windows: []notify.WindowStatus{},
	}
	if r.OnlyNew {
		n.Type, n.Count = notify.TypeNew, 1
		return n
	}
	n.Type, n.CountBy = notify.TypeThreshold, rules.CountEvents
	if r.Users {
		n.CountBy = rules.CountUsers
	}
	for i, w := range r.Windows {
		n.Windows = append(n.Windows, notify.WindowStatus{
			Threshold: w.Threshold,
			Period:    w.Period.Milliseconds(),
			Count:     o.Counts[i],
			ResetAt:   o.ResetAt(i).UTC(),
			Spike:     SpikeStatus(w, o.Counts[i], o.Baseline(i)),
		})
	}
	fired := n.Windows[o.Window]
	n.Count, n.Threshold, n.Period = fired.Count, fired.Threshold, fired.Period
	return n
}

// SpikeStatus is what a spike window's count and baseline count say
// (docs/contract.md §5.1); nil for a plain window.
func SpikeStatus(w rules.Window, count, base int64) *notify.Spike {
	sp := w.Spike
	if sp == nil {
		return nil
	}
	s := &notify.Spike{Factor: sp.Factor, Baseline: sp.Baseline.Milliseconds(), Floor: sp.Floor,
		BaselineCount: base, Rate: w.Rate(base)}
	if s.Rate > 0 {
		s.Ratio = float64(count) / s.Rate
	}
	return s
}

// Link makes the link to an event in messages.
type Link struct {
	// Template has {projectId}, {groupHash} and {eventId}, the group's
	// document's _id in Hawk's events database (KLAXON_EVENT_URL); ""
	// for no link.
	Template string
	// Fallback, with {projectId} and {groupHash}, is the link when
	// Template has {eventId} and the event's id is unknown
	// (KLAXON_EVENT_URL_FALLBACK); "" leaves the link out then.
	Fallback string
}

// URL fills the template, or the fallback when the template needs an
// eventID that is "": "" when neither applies. The values come from
// events and Hawk's database: every byte but RFC 3986's unreserved ones is
// percent-encoded, so each stays one path segment or query value, and
// cannot end a link in any channel's markup.
func (l Link) URL(projectID, groupHash, eventID string) string {
	template := l.Template
	if eventID == "" && strings.Contains(template, "{eventId}") {
		template = l.Fallback
	}
	if template == "" {
		return ""
	}
	return strings.NewReplacer("{projectId}", escapeAll(projectID), "{groupHash}", escapeAll(groupHash),
		"{eventId}", escapeAll(eventID)).Replace(template)
}

// history is the group's history as a firing's message tells it. Hawk's
// count is read through a cache (hawkdb.Reader, 5 s), so the firing of a
// burst may see it from before the burst; the total is never told below
// the counts the message gives beside it: those events are the group's.
func history(g hawkdb.Group, n *notify.Notification) *notify.History {
	total := max(g.TotalCount, n.Count)
	for _, w := range n.Windows {
		total = max(total, w.Count)
	}
	return &notify.History{TotalCount: total, FirstSeen: g.FirstSeen, DaysRepeated: g.DaysRepeated, TopFrame: g.TopFrame}
}

func escapeAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// maxID is the longest message-id or repetitionId taken as an identity; a
// longer one is hashed, so a key stays small whatever a producer sends.
const maxID = 128

// identity is what names one occurrence: the AMQP message-id, else Hawk's
// repetitionId, else nothing. A body is no identity: two occurrences of an
// error can be byte for byte the same message.
func identity(d *queue.Delivery, m *event.Message) string {
	return Identity(d.MessageID, m)
}

// Identity is the identity of a message with this AMQP message-id ("" for
// none) and body, as the evaluator counts it; "" when it has none. Tools
// that replay messages (klaxon backtest) name them the same way.
func Identity(messageID string, m *event.Message) string {
	switch {
	case messageID != "":
		return short("id:" + messageID)
	case m.Event.RepetitionID != nil && *m.Event.RepetitionID != "":
		return short("rep:" + *m.Event.RepetitionID)
	}
	return ""
}

func short(id string) string {
	if len(id) <= maxID {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:16])
}
