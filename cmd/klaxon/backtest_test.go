package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

const (
	projectA = "5e3eef0679fa3700a0198a49"
	projectB = "5e3eef0679fa3700a0198a4a" // has no rules in the backtests
)

// TestBacktestFixedWindowTrap replays README's trap: 1 event, then 900 in
// minute two and 900 in minute three, against "1000 in 2 minutes". The
// sliding window fires once, in minute three; the timeline shows where.
func TestBacktestFixedWindowTrap(t *testing.T) {
	rulesFile := writeTemp(t, "rules.yml", projectA+`:
  - id: thousand-in-two-minutes
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 1000
    thresholdPeriod: 120000
    channels: {webhook: {isEnabled: true, endpoint: "https://example.com/hook", minPeriod: 0}}
`)
	start := float64(time.Now().Add(-time.Hour).Unix())
	var lines []string
	add := func(at float64) {
		lines = append(lines, fmt.Sprintf(`{"projectId":%q,"event":{"title":"DB timeout","groupHash":"g1","isNew":false,"repetitionId":"r%d","timestamp":%.3f}}`,
			projectA, len(lines), at))
	}
	add(start + 10)
	for i := range 900 {
		add(start + 60 + float64(i)*0.05)
	}
	for i := range 900 {
		add(start + 120 + float64(i)*0.05)
	}
	lines = append(lines, "not json", fmt.Sprintf(`{"projectId":%q,"event":{"title":"x","groupHash":"g","timestamp":%.0f}}`, projectB, start))
	eventsFile := writeTemp(t, "events.ndjson", strings.Join(lines, "\n")+"\n")

	r := klaxon(t, nil, "backtest", "--rules", rulesFile, "--events", eventsFile)
	if r.code != exitOK {
		t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"thousand-in-two-minutes  g1     #0: 1000 in 2m0s  1000",
		eventsFile + ":1802: dead-lettered: message is not a JSON object",
		"1 firing, 1801 events matched",
		"1803 events: 1801 counted, 0 duplicate, 0 unmatched, 1 for projects without rules, 1 dead-lettered; 1 firing",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}

	r = klaxon(t, nil, "backtest", "--rules", rulesFile, "--events", eventsFile, "--json")
	var rep replayReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	// The 1000th event in the window: the 99th of minute three.
	if len(rep.Firings) != 1 || rep.Firings[0].Count != 1000 || rep.Firings[0].Line != 901+99 {
		t.Fatalf("firings %+v", rep.Firings)
	}
}

// TestBacktestNeedsTimestamps: the worker counts an event without one at
// Redis' clock; a replay cannot, and says so rather than guess.
func TestBacktestNeedsTimestamps(t *testing.T) {
	rulesFile := writeTemp(t, "rules.yml", projectA+": []\n")
	eventsFile := writeTemp(t, "events.ndjson", `{"projectId":"`+projectA+`","event":{"title":"x","groupHash":"g"}}`+"\n")
	r := klaxon(t, nil, "backtest", "--rules", rulesFile, "--events", eventsFile)
	if r.code != exitUsage || !strings.Contains(r.stderr, "line 1: event.timestamp is missing") {
		t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if r := klaxon(t, nil, "backtest", "--rules", rulesFile); r.code != exitUsage || !strings.Contains(r.stderr, "--events is required") {
		t.Fatalf("no --events: exit %d: %s", r.code, r.stderr)
	}
}

// TestBacktestAgreesWithEngine holds backtest to the worker: random streams
// of messages go through the evaluator with the real counter on Redis, and
// through backtest; the firings must be the same, ids included. The
// evaluator decodes, matches and names messages itself, so what is compared
// is the whole path from message to firing, not the counter alone.
func TestBacktestAgreesWithEngine(t *testing.T) {
	rdb := testenv.Redis(t)
	for s := range 12 {
		rng := rand.New(rand.NewPCG(14, uint64(s)))
		rulesYAML := randomRules(rng)
		lines := randomMessages(rng)
		rulesFile := writeTemp(t, "rules.yml", rulesYAML)
		eventsFile := writeTemp(t, "events.ndjson", strings.Join(lines, "\n")+"\n")

		r := klaxon(t, nil, "backtest", "--rules", rulesFile, "--events", eventsFile, "--json")
		if r.code != exitOK {
			t.Fatalf("stream %d: backtest exit %d: %s", s, r.code, r.stderr)
		}
		var rep replayReport
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatal(err)
		}

		specs, err := store.NewFileSource(rulesFile).Load(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		pub := &capture{}
		eval := &evaluator.Evaluator{
			Rules:         store.Compile(specs, time.Now()),
			Counter:       counter.New(rdb, counter.Options{Prefix: testenv.KeyPrefix(t)}),
			Publisher:     pub,
			DeadQueue:     "dead",
			DeliveryQueue: "deliveries",
			Log:           slog.New(slog.NewTextHandler(io.Discard, nil)),
			Metrics:       metrics.New(prometheus.NewRegistry()),
		}
		// Batches of random sizes, as a consumer takes them off the queue.
		for i := 0; i < len(lines); {
			n := min(1+rng.IntN(16), len(lines)-i)
			b := &queue.Batch{ID: rng.Int64N(1<<53-1) + 1, Attempt: 1}
			for _, line := range lines[i : i+n] {
				b.Deliveries = append(b.Deliveries, queue.Delivery{Body: []byte(line)})
			}
			if err := eval.Handle(context.Background(), b); err != nil {
				t.Fatalf("stream %d: %v", s, err)
			}
			i += n
		}
		engine := pub.firings(t)

		if len(engine) != len(rep.Firings) {
			t.Errorf("stream %d: engine fired %d times, backtest %d\nrules:\n%s", s, len(engine), len(rep.Firings), rulesYAML)
		}
		for i := range min(len(engine), len(rep.Firings)) {
			got, want := rep.Firings[i], engine[i]
			got.Line = 0
			if !got.Time.Equal(want.Time) {
				t.Errorf("stream %d firing %d: at %s, engine at %s", s, i, got.Time, want.Time)
			}
			got.Time = want.Time
			if got != want {
				t.Errorf("stream %d firing %d:\nbacktest %+v\nengine   %+v", s, i, got, want)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		t.Logf("stream %d: %d messages, %d firings agree", s, len(lines), len(engine))
	}
}

// capture is a Publisher that keeps what the evaluator publishes.
type capture struct {
	mu   sync.Mutex
	msgs []queue.Message
}

func (c *capture) Publish(_ context.Context, msgs ...queue.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, msgs...)
	return nil
}

// firings are the distinct firings of the delivery jobs published, in
// order; a replayed firing's jobs come again with the same id.
func (c *capture) firings(t *testing.T) []firing {
	seen := map[string]bool{}
	var out []firing
	for _, m := range c.msgs {
		if m.RoutingKey != "deliveries" {
			continue
		}
		job, err := wire.DecodeJob(m.Body)
		if err != nil {
			t.Fatal(err)
		}
		// A job carries one firing, or an event's firings for one
		// destination.
		for _, fg := range job.Firings {
			n := fg.Notification
			if seen[n.ID] {
				continue
			}
			seen[n.ID] = true
			f := firing{ID: n.ID, Time: n.FiredAt, Type: n.Type, ProjectID: n.ProjectID, RuleID: n.RuleID,
				GroupHash: n.Event.GroupHash, Window: -1, Count: n.Count}
			if n.Type == "threshold" {
				f.Threshold, f.Period = n.Threshold, n.Period
				for i, w := range n.Windows {
					if w.Threshold == n.Threshold && w.Period == n.Period && w.Count == n.Count {
						f.Window = i
						break
					}
				}
			}
			out = append(out, f)
		}
	}
	return out
}

// randomRules writes 1 to 5 rules of projectA: new groups and thresholds,
// with filters, several windows, cooldowns and counting users.
func randomRules(rng *rand.Rand) string {
	var b strings.Builder
	b.WriteString(projectA + ":\n")
	filters := []string{"", "including: [db]", "excluding: [staging]", "including: [typeerror, timeout]"}
	periods := []int{1000, 5000, 30000, 120000}
	for i := range 1 + rng.IntN(5) {
		fmt.Fprintf(&b, "  - id: rule-%d\n    isEnabled: true\n", i)
		if f := filters[rng.IntN(len(filters))]; f != "" {
			fmt.Fprintf(&b, "    %s\n", f)
		}
		if rng.IntN(4) == 0 {
			b.WriteString("    whatToReceive: ONLY_NEW\n")
		} else {
			b.WriteString("    whatToReceive: SEEN_MORE\n    windows:\n")
			for range 1 + rng.IntN(2) {
				fmt.Fprintf(&b, "      - {threshold: %d, period: %d}\n", 2+rng.IntN(6), periods[rng.IntN(len(periods))])
			}
			if rng.IntN(3) == 0 {
				fmt.Fprintf(&b, "    cooldown: %d\n", 1000+rng.IntN(20000))
			}
			if rng.IntN(5) == 0 {
				b.WriteString("    countBy: users\n")
			}
		}
		b.WriteString("    channels: {webhook: {isEnabled: true, endpoint: \"https://example.com/hook\", minPeriod: 0}}\n")
	}
	return b.String()
}

// randomMessages makes 100 to 400 messages: bursts, quiet spells, late
// events, repeats of earlier messages, messages without an identity, and
// some the worker dead-letters or has no rules for.
func randomMessages(rng *rand.Rand) []string {
	titles := []string{"DB timeout", "db down in staging", "TypeError: x", "staging TypeError", "Other"}
	groups := []string{"g1", "g2", "g3"}
	users := []string{"", "u1", "u2", "u3", "u4"}
	clock := time.Now().Add(-2 * time.Hour).UnixMilli()
	var lines []string
	for n := 100 + rng.IntN(300); len(lines) < n; {
		switch rng.IntN(40) {
		case 0:
			lines = append(lines, `{"projectId": "nope"}`)
			continue
		case 1, 2:
			if len(lines) > 0 {
				lines = append(lines, lines[rng.IntN(len(lines))]) // a repeat
				continue
			}
		case 3:
			clock += rng.Int64N(300_000) // a quiet spell
		}
		clock += rng.Int64N(500)
		at := clock
		if rng.IntN(10) == 0 {
			at -= rng.Int64N(60_000) // late
		}
		project := projectA
		if rng.IntN(20) == 0 {
			project = projectB
		}
		rep := "null"
		if rng.IntN(4) != 0 {
			rep = fmt.Sprintf("%q", fmt.Sprintf("r%d", len(lines)))
		}
		user := ""
		if u := users[rng.IntN(len(users))]; u != "" {
			user = fmt.Sprintf(`,"user":{"id":%q}`, u)
		}
		lines = append(lines, fmt.Sprintf(`{"projectId":%q,"event":{"title":%q,"groupHash":%q,"isNew":%t,"repetitionId":%s,"timestamp":%.3f%s}}`,
			project, titles[rng.IntN(len(titles))], groups[rng.IntN(len(groups))], rng.IntN(3) == 0, rep, float64(at)/1000, user))
	}
	return lines
}
