package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
)

// The two projects of a run and their rules. Every SEEN_MORE rule has a
// cooldown (1 h) far longer than a group's whole span (at most 6 min), so it
// fires at most once per group: firing again after a cooldown would depend
// on the order (a late burst seen first disarms the rule for the early one).
const (
	projectA = "5e3eef0679fa3700a0198a49"
	projectB = "5e3eef0679fa3700a0198b77"
	cooldown = int64(time.Hour / time.Millisecond)
)

// ruleSpecs are the rules of the run, all notifying the webhook at endpoint.
func ruleSpecs(endpoint string) map[string][]rules.Spec {
	webhook := map[string]rules.ChannelSpec{rules.Webhook: {IsEnabled: true, Endpoint: endpoint, MinPeriod: 0}}
	seenMore := func(id string, windows ...rules.WindowSpec) rules.Spec {
		return rules.Spec{ID: id, IsEnabled: true, WhatToReceive: rules.SeenMore, Windows: windows,
			Cooldown: cooldown, Channels: webhook}
	}
	users := seenMore("users-6-in-30s")
	users.Windows = nil
	users.Threshold, users.ThresholdPeriod, users.CountBy = 6, 30000, rules.CountUsers
	timeouts := seenMore("timeouts-10-in-10s", rules.WindowSpec{Threshold: 10, Period: 10000})
	timeouts.Including = []string{"TIMEOUT"}
	newNotStaging := rules.Spec{ID: "new-not-staging", IsEnabled: true, WhatToReceive: rules.OnlyNew,
		Excluding: []string{"staging"}, Channels: webhook}
	return map[string][]rules.Spec{
		projectA: {
			{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: webhook},
			seenMore("storm-20-in-60s", rules.WindowSpec{Threshold: 20, Period: 60000}),
			seenMore("spike-8-in-2s-or-25-in-60s",
				rules.WindowSpec{Threshold: 8, Period: 2000}, rules.WindowSpec{Threshold: 25, Period: 60000}),
			users,
			timeouts,
		},
		projectB: {
			newNotStaging,
			seenMore("burst-7-in-1s-or-15-in-5m",
				rules.WindowSpec{Threshold: 7, Period: 1000}, rules.WindowSpec{Threshold: 15, Period: 300000}),
		},
	}
}

// writeRules writes the rules file and reads it back the way the worker
// does, so the tool counts with exactly the rules the workers serve.
func writeRules(ctx context.Context, path string, specs map[string][]rules.Spec) (map[string][]*rules.Rule, error) {
	data, err := yaml.Marshal(specs)
	if err != nil {
		return nil, fmt.Errorf("encode rules: %w", err)
	}
	// Leave out the fields at their zero value, for a file a person reads.
	var doc map[string][]map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("encode rules: %w", err)
	}
	for _, list := range doc {
		for _, rule := range list {
			for k, v := range rule {
				switch v := v.(type) {
				case int:
					if v == 0 {
						delete(rule, k)
					}
				case string:
					if v == "" {
						delete(rule, k)
					}
				case []any:
					if len(v) == 0 {
						delete(rule, k)
					}
				}
			}
		}
	}
	if data, err = yaml.Marshal(doc); err != nil {
		return nil, fmt.Errorf("encode rules: %w", err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return nil, fmt.Errorf("write rules: %w", err)
	}
	loaded, err := store.NewFileSource(path).Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("read rules back: %w", err)
	}
	if len(loaded.Problems) > 0 {
		return nil, fmt.Errorf("rules file %s has problems: %v", path, loaded.Problems)
	}
	compiled := map[string][]*rules.Rule{}
	for project, list := range loaded.Projects {
		for _, s := range list {
			r, warnings, err := rules.Compile(project, s)
			switch {
			case err != nil:
				return nil, fmt.Errorf("rule %s of %s: %w", s.ID, project, err)
			case r == nil || len(warnings) > 0:
				return nil, fmt.Errorf("rule %s of %s: disabled or warned about: %v", s.ID, project, warnings)
			}
			compiled[project] = append(compiled[project], r)
		}
	}
	return compiled, nil
}

// message is one incoming event as published.
type message struct {
	ID   string // AMQP message-id, unique per message
	Body []byte
	at   time.Time // when it counts: its timestamp, in ms
	seq  int       // tie-break for the publish order
}

// firing is a notification the run must produce, as the model computes it.
type firing struct {
	ID        string    `json:"id"`
	ProjectID string    `json:"projectId"`
	RuleID    string    `json:"ruleId"`
	GroupHash string    `json:"groupHash"`
	At        time.Time `json:"firedAt"`
}

// plan is what a run publishes and what it must receive.
type plan struct {
	Messages []message         // in publish order
	Expected map[string]firing // by notification id
	Groups   int               // generated
	Kept     int               // groups whose firings agree in every order tried
	Dropped  []string          // groups left out, with why (a few)
	Orders   int               // orders each group was checked in
}

// group is one event group as generated.
type group struct {
	project string
	hash    string
	msgs    []message // in time order
}

// makePlan generates events for groups groups, about events in all, with the
// run id in every message id, and keeps the groups whose firings do not
// depend on the order in which workers happen to process them.
func makePlan(seed uint64, runID string, events, groups int, rulesOf map[string][]*rules.Rule, now time.Time) (*plan, error) {
	if groups < 1 || events < groups {
		return nil, fmt.Errorf("want at least one group and one event per group, got %d events over %d groups", events, groups)
	}
	rng := rand.New(rand.NewPCG(seed, 0x6b6c61786f6e))
	base := now.Add(-2 * time.Hour).Truncate(time.Second) // past: never clamped to Redis' now
	p := &plan{Expected: map[string]firing{}, Groups: groups}
	seq := 0
	var kept []*group
	for g := range groups {
		budget := events / groups
		if g < events%groups {
			budget++
		}
		gr, err := makeGroup(rng, runID, g, budget, base, &seq)
		if err != nil {
			return nil, err
		}
		fired, why, orders := checkGroup(rng, gr, rulesOf[gr.project])
		p.Orders = orders
		if why != "" {
			if len(p.Dropped) < 5 {
				p.Dropped = append(p.Dropped, gr.hash+": "+why)
			} else if len(p.Dropped) == 5 {
				p.Dropped = append(p.Dropped, "…")
			}
			continue
		}
		for _, f := range fired {
			// Two firings under one id would be one notification expected
			// for two: the missing one could never be missed.
			if old, ok := p.Expected[f.ID]; ok {
				return nil, fmt.Errorf("firings %s/%s@%s and %s/%s@%s of %s share the id %s", old.GroupHash, old.RuleID,
					old.At.UTC().Format(time.RFC3339Nano), f.GroupHash, f.RuleID, f.At.UTC().Format(time.RFC3339Nano), f.ProjectID, f.ID)
			}
			p.Expected[f.ID] = f
		}
		kept = append(kept, gr)
	}
	p.Kept = len(kept)
	for _, gr := range kept {
		p.Messages = append(p.Messages, gr.msgs...)
	}
	// Publish in time order, as events happen; the workers and the crashes
	// then scramble it.
	slices.SortFunc(p.Messages, func(a, b message) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.seq - b.seq
	})
	return p, nil
}

// makeGroup generates one group: one to four bursts, every event of a burst
// at the same timestamp (half-second steps, exact in float64 seconds). The
// earlier bursts are small and the last one takes the rest of the budget,
// so a rule can only reach its threshold at the last burst, whatever the
// order: windows end at the newest event seen, late events count where they
// belong, and no earlier burst is enough on its own. Events of the first
// burst may be new (isNew), all at one time. One group in twenty breaks
// these rules on purpose (a big early burst, or new events at two times):
// the order check must catch it.
func makeGroup(rng *rand.Rand, runID string, g, budget int, base time.Time, seq *int) (*group, error) {
	gr := &group{project: projectA, hash: fmt.Sprintf("g%04d-%x", g, rng.Uint32())}
	if rng.IntN(4) == 0 {
		gr.project = projectB
	}
	// A mix for the title filters: "timeout" (any case) and "staging" matter.
	titles := [...]string{
		"TypeError: x is undefined",
		"Timeout talking to the database",
		"staging: connection reset by peer",
		"ReferenceError: y is not defined",
		"Database timeout in staging worker",
		"panic: runtime error: index out of range",
	}
	title := titles[rng.IntN(len(titles))]
	risky := rng.IntN(20) == 0
	bursts := min(1+rng.IntN(4), budget)
	gaps := [...]time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second,
		10 * time.Second, 45 * time.Second, 2 * time.Minute}
	at := base.Add(time.Duration(rng.IntN(3600)) * time.Second)
	newFirst := rng.IntN(10) < 7
	users := 1 + rng.IntN(12) // distinct users of the last burst
	left := budget
	for b := range bursts {
		last := b == bursts-1
		n := min(1+rng.IntN(3), left-(bursts-1-b)) // keep one event for each later burst
		if risky && b == 0 && !last {
			n = min(25, left-(bursts-1-b))
		}
		if last {
			n = left
		}
		left -= n
		for range n {
			user := "u" + strconv.Itoa(rng.IntN(2)) // two users before the last burst
			if last {
				user = "u" + strconv.Itoa(rng.IntN(users))
			}
			isNew := b == 0 && newFirst || last && risky && rng.IntN(2) == 0
			m, err := encode(runID, *seq, gr, title, at, isNew, user)
			if err != nil {
				return nil, err
			}
			m.seq = rng.IntN(1 << 30) // random order inside a burst
			gr.msgs = append(gr.msgs, m)
			*seq++
		}
		at = at.Add(gaps[rng.IntN(len(gaps))])
	}
	slices.SortStableFunc(gr.msgs, func(a, b message) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.seq - b.seq
	})
	return gr, nil
}

// encode builds one Hawk message and reads its time back through the
// worker's own decoder, so the model counts it exactly where Klaxon will.
func encode(runID string, seq int, gr *group, title string, at time.Time, isNew bool, user string) (message, error) {
	type ev struct {
		Title        string            `json:"title"`
		GroupHash    string            `json:"groupHash"`
		IsNew        bool              `json:"isNew"`
		RepetitionID *string           `json:"repetitionId"`
		Timestamp    float64           `json:"timestamp"`
		User         map[string]string `json:"user"`
	}
	var rep *string
	if !isNew {
		r := fmt.Sprintf("rep-%d", seq)
		rep = &r
	}
	body, err := json.Marshal(map[string]any{
		"projectId": gr.project,
		"event": ev{Title: title, GroupHash: gr.hash, IsNew: isNew, RepetitionID: rep,
			Timestamp: float64(at.UnixMilli()) / 1000, User: map[string]string{"id": user}},
	})
	if err != nil {
		return message{}, fmt.Errorf("encode event: %w", err)
	}
	m, err := event.Decode(body)
	if err != nil {
		return message{}, fmt.Errorf("generated an event Klaxon refuses: %w", err)
	}
	t := time.UnixMilli(max(m.Event.Time().UnixMilli(), 0))
	return message{ID: fmt.Sprintf("chaos-%s-%d", runID, seq), Body: body, at: t}, nil
}

// checkGroup runs the model over the group's events in several orders: the
// publish order (time order), reversed, and shuffles. It returns the
// firings when every order gives the same, else why not. Time order and its
// reverse are the extremes: the first fires at the earliest time any rule
// can, the second at the latest.
func checkGroup(rng *rand.Rand, gr *group, projectRules []*rules.Rule) ([]firing, string, int) {
	orders := [][]message{gr.msgs, reversed(gr.msgs)}
	for range 4 {
		s := slices.Clone(gr.msgs)
		rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		orders = append(orders, s)
	}
	var want []firing
	for i, order := range orders {
		got, err := modelFirings(gr, order, projectRules)
		if err != nil {
			return nil, err.Error(), len(orders)
		}
		if i == 0 {
			want = got
			continue
		}
		if !slices.Equal(ids(want), ids(got)) {
			return nil, fmt.Sprintf("order %d fires %s, time order %s", i, describe(got), describe(want)), len(orders)
		}
	}
	return want, "", len(orders)
}

// modelFirings is what the counting model fires for the group's events
// processed in this order, sorted by id.
func modelFirings(gr *group, order []message, projectRules []*rules.Rule) ([]firing, error) {
	m := counter.NewModel()
	var out []firing
	for _, msg := range order {
		hm, err := event.Decode(msg.Body)
		if err != nil {
			return nil, err
		}
		var matched []*rules.Rule
		for _, r := range projectRules {
			if r.Matches(hm.Event.Title, hm.Event.IsNew) {
				matched = append(matched, r)
			}
		}
		if len(matched) == 0 {
			continue // the evaluator does not count it
		}
		res := m.Observe(counter.Event{
			ID: "id:" + msg.ID, ProjectID: hm.ProjectID, GroupHash: hm.Event.GroupHash,
			UserID: hm.Event.UserID(), Time: msg.at, Rules: matched,
		}, msg.at)
		for _, o := range res.Outcomes {
			if o.Fired {
				out = append(out, firing{
					ID:        firingID(hm.ProjectID, o.Rule.ID, hm.Event.GroupHash, o.At),
					ProjectID: hm.ProjectID, RuleID: o.Rule.ID, GroupHash: hm.Event.GroupHash, At: o.At,
				})
			}
		}
	}
	slices.SortFunc(out, func(a, b firing) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// firingID is counter.FiringID, the id the workers give a firing; a
// variable so a test can break it.
var firingID = counter.FiringID

func ids(fs []firing) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.ID
	}
	return out
}

func reversed(ms []message) []message {
	r := slices.Clone(ms)
	slices.Reverse(r)
	return r
}

func describe(fs []firing) string {
	s := "["
	for i, f := range fs {
		if i > 0 {
			s += " "
		}
		s += f.RuleID + "@" + f.At.UTC().Format("15:04:05.000")
	}
	return s + "]"
}
