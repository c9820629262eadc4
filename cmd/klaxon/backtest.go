package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
)

const backtestUsage = `Usage: klaxon backtest --events FILE [--rules FILE] [--json]

Replays events through the rules with the worker's semantics, without Redis
or the network (but for Hawk's events database, when configured), and
prints each firing (time, project, rule, group, window, count, id) and a
timeline per rule: "what would this rule have sent?".

--events is NDJSON: one incoming message a line, as the queue carries it
({"projectId": …, "event": {"title", "groupHash", "isNew", "repetitionId",
"timestamp", …}}), in the order the queue would deliver them. An event
counts at its event.timestamp (Unix seconds). Stock Hawk sends none, nor
event.user: with Hawk's events database (KLAXON_EVENTS_MONGO_URL) an event
lacking them takes them as the worker would, a group's first (isNew) from
its group's document, a repetition from its document in
repetitions:<projectId>, 1,000 lines at a time with one query per project.
The worker reads repetitions only in projects with a countBy users rule
and counts the others at their arrival on Redis' clock, which a replay
does not have: a replay reads every repetition without a timestamp. An
event still without a time (no database, or its document not found) stops
the replay, naming its line and why, as does a read that fails. A line the
worker would dead-letter is reported and left out. Hawk's marks are not
applied: they say what people decided since (a group resolved or ignored
today), not at the events' time, so every event counts and none is a
regression. An event's identity is its repetitionId, as for a message
without an AMQP message-id: a repeated one counts once. Firing ids are
those the worker would give.

--rules is a YAML rules file; without it, KLAXON_RULES_FILE, else MongoDB.

Exit status: 0 the replay ran (whatever fired), 2 it could not (usage,
unreadable files, an event without a time, the events database
unreachable or failing).

Flags:
`

// firing is one firing of a replay: the webhook body's facts of it.
type firing struct {
	ID        string    `json:"id"`
	Time      time.Time `json:"time"`
	Type      string    `json:"type"` // "new" or "threshold"
	ProjectID string    `json:"projectId"`
	RuleID    string    `json:"ruleId"`
	GroupHash string    `json:"groupHash"`
	// Window is the index of the window that fired, -1 for a new group;
	// Threshold, Period (ms) and Count are that window's.
	Window    int   `json:"window"`
	Threshold int64 `json:"threshold,omitempty"`
	Period    int64 `json:"period,omitempty"`
	Count     int64 `json:"count"`
	Line      int   `json:"line"` // of the event that fired it, in the events file
}

// ruleStats is what a replay did with one rule.
type ruleStats struct {
	ProjectID string `json:"projectId"`
	RuleID    string `json:"ruleId"`
	Matched   int    `json:"matched"` // events that matched the rule
	Firings   int    `json:"firings"`
	// times of the matched events and of the firings, for the timeline
	matchedAt, firedAt []time.Time
}

// deadLine is an events file line the worker would dead-letter.
type deadLine struct {
	Line   int    `json:"line"`
	Reason string `json:"reason"`
}

// replayReport is what backtest prints; its JSON form is --json's.
type replayReport struct {
	Firings []firing     `json:"firings"`
	Rules   []*ruleStats `json:"rules"`
	Events  struct {
		Counted   int `json:"counted"`
		Duplicate int `json:"duplicate"`
		Unmatched int `json:"unmatched"`
		NoRules   int `json:"no_rules"`
		Dead      int `json:"dead"`
	} `json:"events"`
	Dead        []deadLine `json:"dead"`
	First, Last time.Time  `json:"-"`
}

// projectRules gives the matcher of a project's enabled rules, as the rule
// cache does.
type projectRules interface {
	Matcher(projectID string) *rules.Matcher
}

// replayChunk is how many lines a replay reads before it looks their
// events up in Hawk's events database: one query per project and chunk,
// not one per event.
const replayChunk = 1000

// replayLine is a line of the events file, decoded.
type replayLine struct {
	n    int
	body []byte
	m    event.Message
	err  error // why the worker would dead-letter it
}

// replayer counts a replay's events with the counter's Model.
type replayer struct {
	set   projectRules
	now   time.Time
	rep   *replayReport
	stats map[*rules.Rule]*ruleStats
	model *counter.Model
}

// replay reads messages from r and counts them with the counter's Model,
// matching and naming them exactly as evaluator.Handle does. Timestamps in
// the future are clamped to now, as the engine clamps them to Redis' clock.
// An event without a timestamp takes Hawk's from its events database, hawk
// (nil for none), as the worker would, in chunks of replayChunk lines.
func replay(ctx context.Context, r io.Reader, set projectRules, hawk hawkEvents, now time.Time) (*replayReport, error) {
	rp := &replayer{set: set, now: now, stats: map[*rules.Rule]*ruleStats{}, model: counter.NewModel(),
		rep: &replayReport{Firings: []firing{}, Rules: []*ruleStats{}, Dead: []deadLine{}}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), event.MaxSize+1)
	chunk := make([]replayLine, 0, replayChunk)
	for line := 1; sc.Scan(); line++ {
		body := sc.Bytes()
		if len(strings.TrimSpace(string(body))) == 0 {
			continue
		}
		l := replayLine{n: line, body: bytes.Clone(body)} // the scanner reuses its buffer
		l.m, l.err = event.Decode(l.body)
		if chunk = append(chunk, l); len(chunk) < replayChunk {
			continue
		}
		if err := rp.chunk(ctx, chunk, hawk); err != nil {
			return nil, err
		}
		chunk = chunk[:0]
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	if err := rp.chunk(ctx, chunk, hawk); err != nil {
		return nil, err
	}
	return rp.rep, nil
}

// chunk gives the chunk's events their times, then counts its lines in
// order.
func (rp *replayer) chunk(ctx context.Context, chunk []replayLine, hawk hawkEvents) error {
	if err := timed(ctx, chunk, hawk); err != nil {
		return err
	}
	for i := range chunk {
		rp.line(&chunk[i])
	}
	return nil
}

// timed gives the chunk's events without a timestamp Hawk's, or says
// which has none. Unlike the worker, which reads repetitions only where a
// countBy users rule needs their users, a replay reads every one whose
// event has no time: it has no clock of arrival to count it at.
func timed(ctx context.Context, chunk []replayLine, hawk hawkEvents) error {
	var (
		msgs  []*event.Message
		lines []int
	)
	for i := range chunk {
		if l := &chunk[i]; l.err == nil && (l.m.Event.Timestamp == nil || hawk != nil && l.m.Event.UserID() == "") {
			msgs, lines = append(msgs, &l.m), append(lines, l.n)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	if hawk == nil {
		return fmt.Errorf("line %d: event.timestamp is missing: a replay counts every event at its own time "+
			"(with %s set, it takes Hawk's from its events database, as the worker does)", lines[0], config.EnvEventsMongoURL)
	}
	taken, err := fromHawk(ctx, hawk, msgs, func(*event.Message) bool { return true })
	if err != nil {
		return err
	}
	for i, t := range taken {
		if t.why != "" {
			return fmt.Errorf("line %d: event.timestamp is missing, and Hawk's events database has none: %s", lines[i], t.why)
		}
	}
	return nil
}

// line counts one line as evaluator.Handle would.
func (rp *replayer) line(l *replayLine) {
	rep := rp.rep
	if l.err != nil {
		rep.Dead = append(rep.Dead, deadLine{l.n, l.err.Error()})
		rep.Events.Dead++
		return
	}
	m := &l.m
	matcher := rp.set.Matcher(m.ProjectID)
	if matcher.Len() == 0 {
		rep.Events.NoRules++
		return
	}
	matched := matcher.Match(m.Event.Title, m.Event.IsNew, nil) // as Handle
	if len(matched) == 0 {
		rep.Events.Unmatched++
		return
	}
	te := m.Event.Time()
	if te.After(rp.now) {
		te = rp.now
	}
	if rep.First.IsZero() || te.Before(rep.First) {
		rep.First = te
	}
	if te.After(rep.Last) {
		rep.Last = te
	}
	ev := counter.Event{
		ID: evaluator.Identity("", m), Body: l.body, ProjectID: m.ProjectID,
		GroupHash: m.Event.GroupHash, UserID: m.Event.UserID(), Time: te, Rules: matched,
	}
	res := rp.model.Observe(ev, te)
	if res.Duplicate {
		rep.Events.Duplicate++
		return // its firings were reported at its first delivery
	}
	rep.Events.Counted++
	for i := range res.Outcomes {
		rp.outcome(&ev, m, &res.Outcomes[i], l.n, te)
	}
}

// outcome notes what one rule did with an event counted at te.
func (rp *replayer) outcome(ev *counter.Event, m *event.Message, o *counter.Outcome, line int, te time.Time) {
	st := rp.stats[o.Rule]
	if st == nil {
		st = &ruleStats{ProjectID: m.ProjectID, RuleID: o.Rule.ID}
		rp.stats[o.Rule] = st
		rp.rep.Rules = append(rp.rep.Rules, st)
	}
	st.Matched++
	st.matchedAt = append(st.matchedAt, te)
	if !o.Fired || o.Replayed {
		return
	}
	st.Firings++
	st.firedAt = append(st.firedAt, o.At)
	rp.rep.Firings = append(rp.rep.Firings, newFiring(ev, m, o, line))
}

// newFiring describes a firing with the notification the worker would send.
func newFiring(ev *counter.Event, m *event.Message, o *counter.Outcome, line int) firing {
	n := evaluator.Notification(ev, m, o)
	f := firing{ID: n.ID, Time: n.FiredAt, Type: n.Type, ProjectID: n.ProjectID, RuleID: n.RuleID,
		GroupHash: n.Event.GroupHash, Window: o.Window, Count: n.Count, Line: line}
	if n.Type == notify.TypeThreshold {
		f.Threshold, f.Period = n.Threshold, n.Period
	}
	return f
}

func (a *app) backtest(ctx context.Context, args []string) int {
	const cmd = "backtest"
	run := a.command(cmd, backtestUsage)
	eventsFile := run.flags.String("events", "", "NDJSON file of incoming messages (required)")
	rulesFile := run.flags.String("rules", "", "YAML rules file [KLAXON_RULES_FILE, else MongoDB]")
	asJSON := run.flags.Bool("json", false, "print the firings and per-rule totals as one JSON object")
	if code, done := run.parse(args); done {
		return code
	}
	if *eventsFile == "" {
		return a.usageError(cmd, "--events is required")
	}
	cfg, code, done := run.config()
	if done {
		return code
	}
	snap, _, err := readRules(ctx, cfg, *rulesFile)
	if err != nil {
		return a.fail(cmd, err)
	}
	if n := snap.Skipped(); n > 0 {
		fmt.Fprintf(a.stderr, "klaxon backtest: %s skipped as the worker would skip them; see klaxon rules check\n", plural(n, "rule"))
	}
	f, err := os.Open(*eventsFile)
	if err != nil {
		return a.fail(cmd, err)
	}
	defer f.Close()
	var hawk hawkEvents // a nil *lazyHawk would be a non-nil hawkEvents
	if db := newHawk(cfg); db != nil {
		defer db.Close(context.WithoutCancel(ctx))
		hawk = db
	}
	rep, err := replay(ctx, f, snap, hawk, time.Now())
	if err != nil {
		return a.fail(cmd, fmt.Errorf("%s: %w", *eventsFile, err))
	}
	if *asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return a.fail(cmd, err)
		}
		return exitOK
	}
	printReplay(a.stdout, *eventsFile, rep)
	return exitOK
}

// timelineWidth is how many columns a rule's timeline has.
const timelineWidth = 60

func printReplay(w io.Writer, file string, rep *replayReport) {
	for _, d := range rep.Dead {
		fmt.Fprintf(w, "%s:%d: dead-lettered: %s\n", file, d.Line, d.Reason)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(rep.Firings) > 0 {
		fmt.Fprintln(tw, "TIME\tPROJECT\tRULE\tGROUP\tWINDOW\tCOUNT\tID")
	}
	for _, f := range rep.Firings {
		window := "new group"
		if f.Type == notify.TypeThreshold {
			window = fmt.Sprintf("#%d: %d in %s", f.Window, f.Threshold, time.Duration(f.Period)*time.Millisecond)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", f.Time.UTC().Format("2006-01-02T15:04:05.000Z"),
			f.ProjectID, f.RuleID, shorten(f.GroupHash, 16), window, f.Count, f.ID)
	}
	tw.Flush()
	if len(rep.Rules) > 0 {
		step := max(rep.Last.Sub(rep.First)/timelineWidth, time.Millisecond)
		fmt.Fprintf(w, "\nTimeline %s to %s, one column per %s (. matched, ! fired):\n",
			rep.First.UTC().Format(time.RFC3339), rep.Last.UTC().Format(time.RFC3339), step.Round(time.Millisecond))
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, st := range rep.Rules {
			fmt.Fprintf(tw, "%s\t%s\t|%s|\t%s, %s\n", st.ProjectID, st.RuleID, timeline(st, rep.First, step),
				plural(st.Firings, "firing"), plural(st.Matched, "event")+" matched")
		}
		tw.Flush()
	}
	e := rep.Events
	fmt.Fprintf(w, "\n%s: %d counted, %d duplicate, %d unmatched, %d for projects without rules, %d dead-lettered; %s\n",
		plural(e.Counted+e.Duplicate+e.Unmatched+e.NoRules+e.Dead, "event"),
		e.Counted, e.Duplicate, e.Unmatched, e.NoRules, e.Dead, plural(len(rep.Firings), "firing"))
}

// timeline draws a rule's events and firings in timelineWidth columns.
func timeline(st *ruleStats, first time.Time, step time.Duration) string {
	cols := []byte(strings.Repeat(" ", timelineWidth))
	col := func(t time.Time) int { return min(int(t.Sub(first)/step), timelineWidth-1) }
	for _, t := range st.matchedAt {
		cols[col(t)] = '.'
	}
	for _, t := range st.firedAt {
		cols[col(t)] = '!'
	}
	return string(cols)
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
