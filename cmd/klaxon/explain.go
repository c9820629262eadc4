package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/deliverer"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/snooze"
	"github.com/klaxonhq/klaxon/internal/starved"
	"github.com/klaxonhq/klaxon/internal/store"
)

const explainUsage = `Usage: klaxon explain --project P --rule R (--group G [--title T] [--new] | --event FILE) [--rules FILE] [--json]

Says whether rule R of project P matches an event and why (or why not:
which including or excluding word decided, or "not new" for an ONLY_NEW
rule), and the rule's live state in Redis for the event's group, read
without changing anything: each window's count against its threshold
(for a spike window also its baseline's count, the usual rate and how
many times that the count is, against the factor), which window is
closest to it, armed or in cooldown and until when, when
each window's counted events leave it, the last firing (while the counter
still holds the group: the firing's cooldown, or a window longer) with
each channel's delivery record, any snooze, and the rule's quiet hours:
whether it is quiet now and until when, else when the next quiet period
begins and ends (or that the rule is critical). For a countBy users rule
it says that the rule needs event.user, and whether a worker warned in
the last two hours that the rule's events lack it (then the rule cannot
fire on them).

--event FILE is a sample incoming message (the queue's JSON): it gives the
group, the title and isNew, and explain says what of it the rule cannot
count without (event.user) and whether it counts at its arrival (no
event.timestamp). With Hawk's events database (KLAXON_EVENTS_MONGO_URL) it
first looks the event up as the worker does, and says what the worker
takes from it: an isNew event's time and user from its group's document;
for an event without event.user in a project with a countBy users rule,
its repetition's time and user. The event then lacks only what the
database does not know either. With --group alone the match is not
checked unless --title is given.

Rules come from --rules FILE, else KLAXON_RULES_FILE, else MongoDB; Redis
and KLAXON_PREFIX are the worker's.

Exit status: 0 the explanation was printed, 2 it could not be made (usage,
no such enabled rule, Redis, the rules or the events database
unreachable).

Flags:
`

// explanation is the answer of klaxon explain, as --json prints it.
type explanation struct {
	ProjectID string `json:"projectId"`
	RuleID    string `json:"ruleId"`
	Rule      string `json:"rule"` // in words
	GroupHash string `json:"groupHash"`
	// Match is nil when no title was given.
	Match *matchResult `json:"match,omitempty"`
	// Now is Redis' clock, which the counter uses.
	Now   time.Time    `json:"now"`
	State counterState `json:"state"`
	// LastFiring is nil when the counter holds no firing of the group.
	LastFiring *lastFired      `json:"lastFiring,omitempty"`
	Snoozed    []snooze.Snooze `json:"snoozed,omitempty"`
	// Quiet is the rule's quiet hours, its own or its project's; nil for
	// none (or a critical rule: Critical).
	Quiet    *quietHours `json:"quiet,omitempty"`
	Critical bool        `json:"critical,omitempty"`
	// Needs is the event field the rule cannot count an event without
	// (countBy users: event.user), nil for none.
	Needs *need `json:"needs,omitempty"`
	// ArrivalTime reports that the sample event (--event) has no
	// event.timestamp, nor takes one from Hawk's events database: it
	// counts at its arrival, on Redis' clock.
	ArrivalTime bool `json:"arrivalTime,omitempty"`
	// FromHawk is what the worker takes for the sample event from Hawk's
	// events database; nil without --event or the database.
	FromHawk *hawkSample `json:"fromHawk,omitempty"`
}

// hawkSample is what the worker takes for an event from Hawk's events
// database.
type hawkSample struct {
	// Read is the collection the worker reads for it: "events:<projectId>"
	// (an isNew event's group) or "repetitions:<projectId>"; "" for none.
	Read string `json:"read,omitempty"`
	// Time and UserID are what it takes; zero and "" for nothing (the
	// event had its own, or the database does not know it).
	Time   time.Time `json:"time,omitzero"`
	UserID string    `json:"userId,omitempty"`
	// NoTime says why the event still has no time; "" when it has one.
	NoTime string `json:"noTime,omitempty"`
}

// quietHours is what a rule's quiet hours mean now, on this machine's
// clock, as the worker's.
type quietHours struct {
	Schedule string `json:"schedule"` // in words, with the zone
	// Now reports that it is quiet now: firings are held until Until.
	Now bool `json:"now"`
	// Since and Until are the quiet period under way, or the next one.
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
}

type need struct {
	Field  string `json:"field"`
	Reason string `json:"reason"` // klaxon_rules_starved_total's label
	// StarvedAt is when a worker last warned that the rule's events
	// lacked the field (within the last two hours); zero when none did.
	StarvedAt time.Time `json:"starvedAt,omitzero"`
	// EventLacks reports that the sample event (--event) lacks it, and
	// that the worker takes none from Hawk's events database.
	EventLacks bool `json:"eventLacks,omitempty"`
}

type matchResult struct {
	Title   string `json:"title"`
	IsNew   bool   `json:"isNew"`
	Matches bool   `json:"matches"`
	Reason  string `json:"reason"`
}

type counterState struct {
	// Counted is false when the counter holds nothing of the rule for the
	// group: it never counted one of its events, or forgot them.
	Counted bool `json:"counted"`
	// Clock is the rule's clock: the newest event counted for the group.
	Clock time.Time `json:"clock,omitzero"`
	Armed bool      `json:"armed"`
	// CooldownUntil is when the rule may fire again, if in cooldown.
	CooldownUntil time.Time      `json:"cooldownUntil,omitzero"`
	Windows       []windowStatus `json:"windows"`
	// Closest is the index of the window nearest its threshold, or -1.
	Closest int `json:"closest"`
}

type windowStatus struct {
	Threshold int64 `json:"threshold"`
	Period    int64 `json:"period"` // ms
	Count     int64 `json:"count"`
	// ResetAt is when the events counted now have all left the window,
	// if no more come; zero when it counts none.
	ResetAt time.Time `json:"resetAt,omitzero"`
	// Spike is a spike window's baseline, as a firing's message tells it
	// (docs/contract.md §5.1); nil for a plain window.
	Spike *notify.Spike `json:"spike,omitempty"`
}

type lastFired struct {
	ID         string           `json:"id"`
	At         time.Time        `json:"at"`
	Deliveries []deliveryRecord `json:"deliveries"`
}

type deliveryRecord struct {
	Channel   string    `json:"channel"`
	State     string    `json:"state"`
	DigestDue time.Time `json:"digestDue,omitzero"`
}

func (a *app) explain(ctx context.Context, args []string) int {
	const cmd = "explain"
	run := a.command(cmd, explainUsage).withRedis()
	defer run.close()
	project := run.flags.String("project", "", "project id (required, unless --event gives it)")
	ruleID := run.flags.String("rule", "", "rule id (required)")
	group := run.flags.String("group", "", "group hash (event.groupHash)")
	title := run.flags.String("title", "", "event title, to check the match with --group")
	isNew := run.flags.Bool("new", false, "with --title: the event is the first of its group (isNew)")
	eventFile := run.flags.String("event", "", "a sample incoming message (JSON): gives project, group, title and isNew")
	rulesFile := run.flags.String("rules", "", "YAML rules file [KLAXON_RULES_FILE, else MongoDB]")
	asJSON := run.flags.Bool("json", false, "print the explanation as one JSON object")
	// The event is read before the other arguments are judged: it may give
	// the project and the group.
	rest, code, done := run.parseArgs(args)
	if done {
		return code
	}
	var (
		match  *matchResult
		sample *event.Message
	)
	if *title != "" {
		match = &matchResult{Title: *title, IsNew: *isNew}
	}
	if *eventFile != "" {
		body, err := os.ReadFile(*eventFile)
		if err != nil {
			return a.fail(cmd, err)
		}
		m, err := event.Decode(body)
		if err != nil {
			return a.fail(cmd, fmt.Errorf("%s: the worker would dead-letter this message: %w", *eventFile, err))
		}
		if *project != "" && !strings.EqualFold(*project, m.ProjectID) {
			return a.usageError(cmd, "--project %s but the event is of project %s", *project, m.ProjectID)
		}
		*project, *group = m.ProjectID, m.Event.GroupHash
		match = &matchResult{Title: m.Event.Title, IsNew: m.Event.IsNew}
		sample = &m
	}
	switch {
	case len(rest) > 0:
		return a.usageError(cmd, "unexpected argument %q", rest[0])
	case *project == "" || *ruleID == "" || *group == "":
		return a.usageError(cmd, "--project, --rule and --group (or --event) are required")
	}
	cfg, rule, code, done := run.rule(ctx, *rulesFile, *project, *ruleID)
	if done {
		return code
	}
	fromHawk, err := sampleFromHawk(ctx, cfg, sample, run.projectRules)
	if err != nil {
		return a.fail(cmd, err)
	}

	x := explanation{ProjectID: rule.ProjectID, RuleID: rule.ID, Rule: rule.Description, GroupHash: *group, Match: match,
		FromHawk: fromHawk}
	if match != nil {
		match.Matches, match.Reason = rule.Explain(match.Title, match.IsNew)
	}
	outs, now, err := counter.New(run.rdb, counter.Options{Prefix: cfg.Prefix, DedupTTL: cfg.DedupTTL}).
		Inspect(ctx, rule.ProjectID, *group, []*rules.Rule{rule})
	if err != nil {
		return a.fail(cmd, err)
	}
	x.Now = now.UTC()
	o := &outs[0]
	x.State = state(o, now)
	if fired, ok := lastFiring(o, *group); ok {
		names := make([]string, len(rule.Channels))
		for i, c := range rule.Channels {
			names[i] = c.Name
		}
		ds, err := deliverer.Inspect(ctx, run.rdb, cfg.Prefix, rule.ProjectID, rule.ID, fired.ID, names)
		if err != nil {
			return a.fail(cmd, err)
		}
		for _, d := range ds {
			fired.Deliveries = append(fired.Deliveries, deliveryRecord{Channel: d.Channel, State: d.State, DigestDue: d.DigestDue.UTC()})
		}
		x.LastFiring = fired
	}
	snoozes, err := snooze.New(run.rdb, cfg.Prefix).List(ctx, rule.ProjectID)
	if err != nil {
		return a.fail(cmd, err)
	}
	for _, s := range snoozes {
		if s.RuleID == rule.ID && (s.GroupHash == "" || s.GroupHash == *group) && s.Until.After(now) {
			x.Snoozed = append(x.Snoozed, s)
		}
	}

	x.Critical = rule.Critical
	if rule.Quiet != nil {
		at := time.Now()
		next := rule.Quiet.Next(at)
		x.Quiet = &quietHours{Schedule: rule.Quiet.String(), Now: !next.Since.After(at), Since: next.Since, Until: next.Until}
	}

	x.Needs, err = needs(ctx, run.rdb, cfg.Prefix, rule, sample, now)
	if err != nil {
		return a.fail(cmd, err)
	}
	x.ArrivalTime = sample != nil && sample.Event.Time().IsZero()

	if *asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(x)
		return exitOK
	}
	a.printExplanation(x)
	return exitOK
}

// sampleFromHawk gives the sample event what the worker takes for it from
// Hawk's events database, and says what that is; nil without a sample or
// the database. As the worker, it reads a repetition only for an event
// without event.user in a project with a countBy users rule (rules).
func sampleFromHawk(ctx context.Context, cfg config.Config, sample *event.Message, project []*rules.Rule) (*hawkSample, error) {
	db := newHawk(cfg)
	if sample == nil || db == nil {
		return nil, nil
	}
	defer db.Close(context.WithoutCancel(ctx))
	users := slices.ContainsFunc(project, func(r *rules.Rule) bool { return r.Users })
	before := sample.Event
	taken, err := fromHawk(ctx, db, []*event.Message{sample}, func(m *event.Message) bool {
		return users && m.Event.UserID() == ""
	})
	if err != nil {
		return nil, err
	}
	h := &hawkSample{Read: taken[0].read, NoTime: taken[0].why}
	if before.Timestamp == nil {
		h.Time = sample.Event.Time().UTC()
	}
	if before.UserID() == "" {
		h.UserID = sample.Event.UserID()
	}
	return h, nil
}

// needs says what field the rule cannot count an event without, whether a
// worker warned lately that its events lack it, and whether the sample
// event does.
func needs(ctx context.Context, rdb redis.UniversalClient, prefix string, r *rules.Rule, sample *event.Message, now time.Time) (*need, error) {
	reason := starved.Lacks(r, "")
	if reason == "" {
		return nil, nil
	}
	n := &need{Field: starved.Field(reason), Reason: reason}
	mark, ok, err := starved.Read(ctx, rdb, prefix, r.ProjectID, r.ID, now)
	if err != nil {
		return nil, err
	}
	if ok && mark.Reason == reason {
		n.StarvedAt = mark.At.UTC()
	}
	n.EventLacks = sample != nil && starved.Lacks(r, sample.Event.UserID()) != ""
	return n, nil
}

// state is what an outcome of Inspect says, in the answers operators want.
func state(o *counter.Outcome, now time.Time) counterState {
	s := counterState{Counted: !o.At.IsZero(), Closest: -1, Windows: []windowStatus{}}
	if s.Counted {
		s.Clock = o.At.UTC()
	}
	// The rule fires again once its clock reaches Rearm: the next event
	// counts at Redis' now or later.
	s.Armed = !now.Before(o.Rearm)
	if !s.Armed {
		s.CooldownUntil = o.Rearm.UTC()
	}
	best := -1.0
	for i, w := range o.Rule.Windows {
		ws := windowStatus{Threshold: w.Threshold, Period: w.Period.Milliseconds(), Count: o.Counts[i],
			Spike: evaluator.SpikeStatus(w, o.Counts[i], o.Baseline(i))}
		if ws.Count > 0 {
			ws.ResetAt = o.ResetAt(i).UTC()
		}
		f := float64(ws.Count) / float64(w.Threshold)
		if sp := ws.Spike; sp != nil {
			// A spike window is as close as the farther of its two marks.
			f = min(f, sp.Ratio/sp.Factor)
		}
		if f > best {
			best, s.Closest = f, i
		}
		s.Windows = append(s.Windows, ws)
	}
	return s
}

// lastFiring is the rule's last firing for the group, while the counter
// remembers it: a firing disarms the rule until its clock plus the
// cooldown, so the firing's time, and with it its deterministic id, is
// Rearm less the cooldown. An edit of the cooldown since then makes this
// wrong; the id then names no delivery records.
func lastFiring(o *counter.Outcome, group string) (*lastFired, bool) {
	if o.Rearm.IsZero() {
		return nil, false
	}
	at := o.Rearm.Add(-max(o.Rule.Cooldown, time.Millisecond))
	return &lastFired{ID: counter.FiringID(o.Rule.ProjectID, o.Rule.ID, group, at), At: at.UTC()}, true
}

func (a *app) printExplanation(x explanation) {
	w := a.stdout
	ts := func(t time.Time) string { return t.Format("2006-01-02T15:04:05.000Z07:00") }
	in := func(t time.Time) string { return "in " + t.Sub(x.Now).Round(time.Second).String() }
	fmt.Fprintf(w, "rule %s of project %s: %s\n", x.RuleID, x.ProjectID, x.Rule)
	switch m := x.Match; {
	case m == nil:
		fmt.Fprintf(w, "match: not checked (give --title or --event)\n")
	case m.Matches:
		fmt.Fprintf(w, "match: yes, %s\n", m.Reason)
	default:
		fmt.Fprintf(w, "match: NO, %s\n", m.Reason)
	}
	s := x.State
	fmt.Fprintf(w, "group %s, in Redis at %s:\n", x.GroupHash, ts(x.Now))
	if !s.Counted {
		fmt.Fprintf(w, "  nothing counted: no event of this group matched the rule lately (or the counts expired)\n")
	}
	for i, ws := range s.Windows {
		line := fmt.Sprintf("  window #%d  %d in %s", i, ws.Threshold, time.Duration(ws.Period)*time.Millisecond)
		if sp := ws.Spike; sp != nil {
			line += fmt.Sprintf(" at %v× the rate over %s", sp.Factor, time.Duration(sp.Baseline)*time.Millisecond)
		}
		line += fmt.Sprintf(": count %d of %d", ws.Count, ws.Threshold)
		if sp := ws.Spike; sp != nil {
			line += ", " + notify.SpikeDetail(sp)
		}
		if !ws.ResetAt.IsZero() {
			line += ", counted events leave it by " + ts(ws.ResetAt)
		}
		if i == s.Closest && len(s.Windows) > 1 {
			line += "  <- closest to its threshold"
		}
		fmt.Fprintln(w, line)
	}
	if s.Armed {
		fmt.Fprintf(w, "  armed: the next matching event that brings a window to its threshold fires\n")
	} else {
		fmt.Fprintf(w, "  in cooldown until %s (%s): no firing before\n", ts(s.CooldownUntil), in(s.CooldownUntil))
	}
	if f := x.LastFiring; f != nil {
		fmt.Fprintf(w, "last firing %s at %s:\n", f.ID, ts(f.At))
		for _, d := range f.Deliveries {
			fmt.Fprintf(w, "  %-8s %s\n", d.Channel, deliveryWords(d))
		}
	} else if s.Counted {
		fmt.Fprintf(w, "no firing remembered for this group\n")
	}
	for _, sn := range x.Snoozed {
		fmt.Fprintf(w, "snoozed until %s (%s)%s\n", ts(sn.Until), in(sn.Until), snoozeScope(sn))
	}
	switch q := x.Quiet; {
	case x.Critical:
		fmt.Fprintf(w, "critical: passes through quiet hours\n")
	case q == nil:
	case q.Now:
		fmt.Fprintf(w, "quiet hours %s: QUIET NOW, until %s (%s): firings are held, then told in one recap per destination\n",
			q.Schedule, q.Until.Format(time.RFC3339), in(q.Until))
	default:
		fmt.Fprintf(w, "quiet hours %s: next quiet period from %s (%s) to %s\n",
			q.Schedule, q.Since.Format(time.RFC3339), in(q.Since), q.Until.Format(time.RFC3339))
	}
	if n := x.Needs; n != nil {
		fmt.Fprintf(w, "needs %s in every event it counts (countBy users); stock Hawk sends none\n", n.Field)
		if !n.StarvedAt.IsZero() {
			fmt.Fprintf(w, "STARVED: a worker saw this rule's events without %s, last warned at %s: it cannot fire on them (log \"rule starved\", klaxon_rules_starved_total{reason=%q})\n",
				n.Field, ts(n.StarvedAt), n.Reason)
		}
		if n.EventLacks {
			fmt.Fprintf(w, "event: no %s%s: this rule cannot count it\n", n.Field, notInHawk(x.FromHawk, ""))
		}
	}
	printTaken(w, x.FromHawk)
	if x.ArrivalTime {
		fmt.Fprintf(w, "event: no event.timestamp%s: it counts at its arrival, on Redis' clock (a backlog drained at once counts as a burst)\n",
			notInHawk(x.FromHawk, x.FromHawk.why()))
	}
}

// printTaken says what the worker takes for the sample event from Hawk's
// events database.
func printTaken(w io.Writer, h *hawkSample) {
	if h == nil {
		return
	}
	if !h.Time.IsZero() {
		fmt.Fprintf(w, "event: no event.timestamp: the worker takes %s from Hawk's events database (%s) and counts it then\n",
			h.Time.Format(time.RFC3339Nano), h.Read)
	}
	if h.UserID != "" {
		fmt.Fprintf(w, "event: no event.user: the worker takes user %q from Hawk's events database (%s)\n", h.UserID, h.Read)
	}
}

// notInHawk says, where the events database is configured, that it does
// not give what the event lacks either, and why if known.
func notInHawk(h *hawkSample, why string) string {
	if h == nil {
		return ""
	}
	if why != "" {
		return ", and the worker takes none from Hawk's events database (" + why + ")"
	}
	return ", and the worker takes none from Hawk's events database"
}

// why is why the event has no time, "" when it has one or h is nil.
func (h *hawkSample) why() string {
	if h == nil {
		return ""
	}
	return h.NoTime
}

func deliveryWords(d deliveryRecord) string {
	switch d.State {
	case "sent":
		return "sent"
	case "failed":
		return "FAILED for good (its job is in the failed queue, with the reason)"
	case "digested":
		if !d.DigestDue.IsZero() {
			return "waiting in the minPeriod digest due at " + d.DigestDue.Format(time.RFC3339)
		}
		return "gathered into a minPeriod digest, since flushed"
	case "omitted":
		return "counted, not listed, in a full minPeriod digest"
	case "snoozed":
		return "held back: the rule was snoozed"
	case "quiet":
		return "held in quiet hours, for the recap at their end"
	case "sending":
		return "being sent by a deliverer now (or retried soon)"
	}
	return "no record: not delivered yet (queued or waiting for a retry), or its record expired"
}

// findRule is enabled rule ruleID of project, from file, else
// KLAXON_RULES_FILE, else MongoDB; the error says why there is none.
func findRule(ctx context.Context, cfg config.Config, file, project, ruleID string) (*rules.Rule, error) {
	snap, name, err := readRules(ctx, cfg, file)
	if err != nil {
		return nil, err
	}
	return ruleIn(snap, name, project, ruleID)
}

// ruleIn is enabled rule ruleID of project in snap, read from name; the
// error says why there is none.
func ruleIn(snap *store.Snapshot, name, project, ruleID string) (*rules.Rule, error) {
	for _, r := range snap.Rules(strings.ToLower(project)) {
		if r.ID == ruleID {
			return r, nil
		}
	}
	why := "no enabled rule " + ruleID + " in project " + project + " in " + name
	for _, p := range snap.Problems() {
		if p.Skipped && strings.EqualFold(p.ProjectID, project) && p.RuleID == ruleID {
			why += "; it is skipped: " + p.Reason
		}
	}
	return nil, errors.New(why)
}

// snoozeScope says what a snooze holds back beyond its rule.
func snoozeScope(s snooze.Snooze) string {
	if s.GroupHash == "" {
		return ", every group"
	}
	return ", group " + s.GroupHash
}
