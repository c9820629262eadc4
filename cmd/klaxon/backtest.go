package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
)

const backtestUsage = `Usage: klaxon backtest --events FILE [--rules FILE] [--json]

Replays events through the rules with the worker's semantics, without Redis
or the network, and prints each firing (time, project, rule, group, window,
count, id) and a timeline per rule: "what would this rule have sent?".

--events is NDJSON: one incoming message a line, as the queue carries it
({"projectId": …, "event": {"title", "groupHash", "isNew", "repetitionId",
"timestamp", …}}), in the order the queue would deliver them. Every event
needs event.timestamp (Unix seconds): the worker counts one without at
Redis' clock, which a replay does not have. A line the worker would
dead-letter is reported and left out. An event's identity is its
repetitionId, as for a message without an AMQP message-id: a repeated one
counts once. Firing ids are those the worker would give.

--rules is a YAML rules file; without it, KLAXON_RULES_FILE, else MongoDB.

Exit status: 0 the replay ran (whatever fired), 2 it could not (usage,
unreadable files, an event without a timestamp).

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

// replay reads messages from r and counts them with the counter's Model,
// matching and naming them exactly as evaluator.Handle does. Timestamps in
// the future are clamped to now, as the engine clamps them to Redis' clock.
func replay(r io.Reader, set projectRules, now time.Time) (*replayReport, error) {
	rep := &replayReport{Firings: []firing{}, Rules: []*ruleStats{}, Dead: []deadLine{}}
	stats := map[*rules.Rule]*ruleStats{}
	model := counter.NewModel()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), event.MaxSize+1)
	for line := 1; sc.Scan(); line++ {
		body := sc.Bytes()
		if len(strings.TrimSpace(string(body))) == 0 {
			continue
		}
		m, err := event.Decode(body)
		if err != nil {
			rep.Dead = append(rep.Dead, deadLine{line, err.Error()})
			rep.Events.Dead++
			continue
		}
		if m.Event.Timestamp == nil {
			return nil, fmt.Errorf("line %d: event.timestamp is missing: a replay counts every event at its own time", line)
		}
		matcher := set.Matcher(m.ProjectID)
		if matcher.Len() == 0 {
			rep.Events.NoRules++
			continue
		}
		matched := matcher.Match(m.Event.Title, m.Event.IsNew, nil) // as Handle
		if len(matched) == 0 {
			rep.Events.Unmatched++
			continue
		}
		te := m.Event.Time()
		if te.After(now) {
			te = now
		}
		if rep.First.IsZero() || te.Before(rep.First) {
			rep.First = te
		}
		if te.After(rep.Last) {
			rep.Last = te
		}
		ev := counter.Event{
			ID: evaluator.Identity("", &m), Body: body, ProjectID: m.ProjectID,
			GroupHash: m.Event.GroupHash, UserID: m.Event.UserID(), Time: te, Rules: matched,
		}
		res := model.Observe(ev, te)
		if res.Duplicate {
			rep.Events.Duplicate++
			continue // its firings were reported at its first delivery
		}
		rep.Events.Counted++
		for i := range res.Outcomes {
			o := &res.Outcomes[i]
			st := stats[o.Rule]
			if st == nil {
				st = &ruleStats{ProjectID: m.ProjectID, RuleID: o.Rule.ID}
				stats[o.Rule] = st
				rep.Rules = append(rep.Rules, st)
			}
			st.Matched++
			st.matchedAt = append(st.matchedAt, te)
			if !o.Fired || o.Replayed {
				continue
			}
			st.Firings++
			st.firedAt = append(st.firedAt, o.At)
			rep.Firings = append(rep.Firings, newFiring(&ev, &m, o, line))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	return rep, nil
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
	eventsFile := run.flags.String("events", "", "NDJSON file of incoming messages, each with event.timestamp (required)")
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
	rep, err := replay(f, snap, time.Now())
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
