package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/starved"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// redisEnv is the environment of a command that reads the test Redis under
// a prefix of its own, with a rules file: rule "storm" counts titles with
// "db" but not "staging", 3 in a minute or 10 in 10 minutes.
func redisEnv(t *testing.T) (map[string]string, *rules.Rule) {
	t.Helper()
	return redisEnvWith(t, "storm", projectA+`:
  - id: storm
    isEnabled: true
    whatToReceive: SEEN_MORE
    including: [db]
    excluding: [staging]
    windows: [{threshold: 3, period: 60000}, {threshold: 10, period: 600000}]
    cooldown: 300000
    channels:
      webhook: {isEnabled: true, endpoint: "http://127.0.0.1:9/hook", minPeriod: 0}
      slack: {isEnabled: true, endpoint: "http://127.0.0.1:9/slack", minPeriod: 0}
`)
}

// redisEnvWith is redisEnv with a rules file of its own, and its rule
// ruleID of projectA.
func redisEnvWith(t *testing.T, ruleID, rulesFile string) (map[string]string, *rules.Rule) {
	t.Helper()
	file := writeTemp(t, "rules.yml", rulesFile)
	env := map[string]string{
		"KLAXON_REDIS_URL": testenv.RedisURL(), "KLAXON_PREFIX": testenv.KeyPrefix(t), "KLAXON_RULES_FILE": file,
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	r, err := findRule(context.Background(), cfg, "", projectA, ruleID)
	if err != nil {
		t.Fatal(err)
	}
	return env, r
}

// TestExplainShowsWhatTheEngineCounted: explain must show the very counts,
// cooldown and firing the worker's engine holds, or it explains a fiction.
// Four events are counted with the engine (the third fires); explain then
// reads the same counts, the cooldown from the firing, the firing's id and
// each channel's delivery record, and changes nothing in Redis.
func TestExplainShowsWhatTheEngineCounted(t *testing.T) {
	env, rule := redisEnv(t)
	ctx := context.Background()
	rdb := testenv.Redis(t)
	eng := counter.New(rdb, counter.Options{Prefix: env["KLAXON_PREFIX"]})
	start := time.Now().Add(-10 * time.Second).Truncate(time.Second)
	var fired counter.Outcome
	for i := range 4 {
		res, err := eng.ObserveBatch(ctx, 0, []counter.Event{{ID: fmt.Sprint("e", i), ProjectID: projectA, GroupHash: "g1",
			Time: start.Add(time.Duration(i) * time.Second), Rules: []*rules.Rule{rule}}})
		if err != nil {
			t.Fatal(err)
		}
		if o := res[0].Outcomes[0]; o.Fired {
			fired = o
		}
	}
	if fired.ID == "" {
		t.Fatal("the engine did not fire")
	}
	// The deliverer's record of the webhook message; slack has none yet.
	if err := rdb.Set(ctx, env["KLAXON_PREFIX"]+":sent:"+fired.ID+":webhook", "sent", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	before := dump(t, env["KLAXON_PREFIX"])

	r := klaxon(t, env, "explain", "--project", projectA, "--rule", "storm", "--group", "g1",
		"--title", "DB timeout on staging", "--json")
	if r.code != exitOK {
		t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	var x explanation
	if err := json.Unmarshal([]byte(r.stdout), &x); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if x.Match == nil || x.Match.Matches || !strings.Contains(x.Match.Reason, `"staging"`) {
		t.Errorf("match %+v, want excluded by staging", x.Match)
	}
	s := x.State
	if !s.Counted || len(s.Windows) != 2 || s.Windows[0].Count != 4 || s.Windows[1].Count != 4 || s.Closest != 0 {
		t.Errorf("state %+v, want 4 events in both windows, #0 closest", s)
	}
	wantClock := start.Add(3 * time.Second)
	if !s.Clock.Equal(wantClock) || s.Armed || !s.CooldownUntil.Equal(fired.At.Add(5*time.Minute)) {
		t.Errorf("clock %v armed %v cooldown until %v; want clock %v, cooldown until %v", s.Clock, s.Armed, s.CooldownUntil, wantClock, fired.At.Add(5*time.Minute))
	}
	o := counter.Outcome{Rule: rule, At: wantClock}
	if !s.Windows[0].ResetAt.Equal(o.ResetAt(0)) {
		t.Errorf("window 0 resets at %v, want %v", s.Windows[0].ResetAt, o.ResetAt(0))
	}
	f := x.LastFiring
	if f == nil || f.ID != fired.ID || !f.At.Equal(fired.At) || len(f.Deliveries) != 2 {
		t.Fatalf("last firing %+v, want %s at %v on 2 channels", f, fired.ID, fired.At)
	}
	for _, d := range f.Deliveries {
		want := map[string]string{"webhook": "sent", "slack": ""}[d.Channel]
		if d.State != want {
			t.Errorf("%s: state %q, want %q", d.Channel, d.State, want)
		}
	}
	if after := dump(t, env["KLAXON_PREFIX"]); after != before {
		t.Errorf("explain changed Redis:\nbefore %s\nafter  %s", before, after)
	}

	// The human form says the same.
	r = klaxon(t, env, "explain", "--project", projectA, "--rule", "storm", "--group", "g1", "--title", "db down")
	for _, want := range []string{`match: yes, the title contains including word "db"`, "window #0  3 in 1m0s: count 4 of 3",
		"<- closest", "in cooldown until", "last firing " + fired.ID, "webhook  sent", "slack    no record"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestExplainEventFileAndUnknownGroup: a sample message gives the group and
// title; a group never counted is said to be so, armed, without a firing.
func TestExplainEventFileAndUnknownGroup(t *testing.T) {
	env, _ := redisEnv(t)
	ev := writeTemp(t, "event.json", `{"projectId":"`+projectA+`","event":{"title":"TypeError","groupHash":"fresh","isNew":true}}`)
	r := klaxon(t, env, "explain", "--rule", "storm", "--event", ev)
	for _, want := range []string{`match: NO, the title contains none of the including words ["db"]`, "group fresh",
		"nothing counted", "armed"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if r := klaxon(t, env, "explain", "--project", projectA, "--rule", "nope", "--group", "g"); r.code != exitUsage || !strings.Contains(r.stderr, "no enabled rule nope") {
		t.Errorf("unknown rule: exit %d, %s", r.code, r.stderr)
	}
}

// dump is every key under prefix with its value and TTL (to the second).
func dump(t *testing.T, prefix string) string {
	t.Helper()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		v, _ := rdb.Dump(ctx, k).Result()
		ttl, _ := rdb.PTTL(ctx, k).Result()
		fmt.Fprintf(&b, "%s=%x ttl~%v; ", k, v, ttl.Round(time.Minute))
	}
	return b.String()
}

// TestExplainTellsOfAStarvedUsersRule: a countBy users rule behind a stock
// Hawk (no event.user) never fires, and explain is where people ask why.
// It says the rule needs event.user, that a worker warned its events lack
// it (the mark the worker's starved.Watch leaves), and what the sample
// event lacks; a rule counting events needs nothing.
func TestExplainTellsOfAStarvedUsersRule(t *testing.T) {
	file := writeTemp(t, "rules.yml", projectA+`:
  - id: users
    isEnabled: true
    whatToReceive: SEEN_MORE
    countBy: users
    threshold: 5
    thresholdPeriod: 60000
    channels:
      webhook: {isEnabled: true, endpoint: "http://127.0.0.1:9/hook", minPeriod: 0}
  - id: events
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 5
    thresholdPeriod: 60000
    channels:
      webhook: {isEnabled: true, endpoint: "http://127.0.0.1:9/hook", minPeriod: 0}
`)
	env := map[string]string{"KLAXON_REDIS_URL": testenv.RedisURL(), "KLAXON_PREFIX": testenv.KeyPrefix(t), "KLAXON_RULES_FILE": file}
	ev := writeTemp(t, "event.json", `{"projectId":"`+projectA+`","event":{"title":"TypeError","groupHash":"g","isNew":false}}`)

	// Before any worker saw the rule starve: the need, and the sample's lack.
	r := klaxon(t, env, "explain", "--rule", "users", "--event", ev)
	for _, want := range []string{"needs event.user in every event it counts", "event: no event.user: this rule cannot count it",
		"event: no event.timestamp: it counts at its arrival"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if strings.Contains(r.stdout, "STARVED") {
		t.Errorf("starved before any worker said so:\n%s", r.stdout)
	}

	// A worker's warning leaves its mark.
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	rule, err := findRule(context.Background(), cfg, "", projectA, "users")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	w := starved.New(starved.Config{Redis: testenv.Redis(t), Prefix: env["KLAXON_PREFIX"], Log: slog.New(slog.DiscardHandler),
		Metrics: metrics.New(prometheus.NewRegistry()), Now: func() time.Time { return at }})
	w.Saw(context.Background(), projectA, rule, starved.NoUser, 3)
	r = klaxon(t, env, "explain", "--rule", "users", "--event", ev, "--json")
	var x explanation
	if err := json.Unmarshal([]byte(r.stdout), &x); err != nil {
		t.Fatalf("%v: %s%s", err, r.stdout, r.stderr)
	}
	if n := x.Needs; n == nil || n.Field != "event.user" || n.Reason != "no_user" || !n.StarvedAt.Equal(at) || !n.EventLacks || !x.ArrivalTime {
		t.Errorf("needs %+v, arrival time %v: want event.user, starved at %v, lacking in the sample, counted at arrival", x.Needs, x.ArrivalTime, at)
	}
	r = klaxon(t, env, "explain", "--rule", "users", "--project", projectA, "--group", "g")
	if !strings.Contains(r.stdout, "STARVED: a worker saw this rule's events without event.user") {
		t.Errorf("output lacks the starvation:\n%s%s", r.stdout, r.stderr)
	}

	withUser := writeTemp(t, "user.json", `{"projectId":"`+projectA+`","event":{"title":"TypeError","groupHash":"g","isNew":false,"timestamp":1700000000,"user":{"id":"u1"}}}`)
	r = klaxon(t, env, "explain", "--rule", "users", "--event", withUser)
	if strings.Contains(r.stdout, "event: no event.user") || strings.Contains(r.stdout, "event: no event.timestamp") {
		t.Errorf("an event with a user and a timestamp lacks neither:\n%s", r.stdout)
	}
	r = klaxon(t, env, "explain", "--rule", "events", "--event", ev)
	if strings.Contains(r.stdout, "needs event.user") || strings.Contains(r.stdout, "STARVED") {
		t.Errorf("a rule counting events needs no field:\n%s", r.stdout)
	}
}

// With Hawk's events database, explain looks a stock-Hawk sample event up
// as the worker does and says what it takes: a repetition's time and user
// where a countBy users rule needs them, an isNew event's from its group.
// It says the event counts at its arrival, or lacks event.user, only where
// the database does not know them either: a repetition it does not hold,
// or one of a project without a users rule, which the worker does not read.
func TestExplainTakesTheSampleFromHawksEventsDatabase(t *testing.T) {
	uri, db := testenv.HawkDatabase(t)
	const t0 = 1700000000
	testenv.HawkGroup(t, db, projectA, "g", 2, t0, 1, nil)
	testenv.HawkGroupUser(t, db, projectA, "g", "alice")
	bob := testenv.HawkRepetition(t, db, projectA, "g", t0+90, testenv.HawkUserDelta("bob"))
	other := testenv.HawkRepetition(t, db, projectB, "p", t0+30, testenv.HawkUserDelta("carol"))
	file := writeTemp(t, "rules.yml", projectA+`:
  - id: users
    isEnabled: true
    whatToReceive: SEEN_MORE
    countBy: users
    threshold: 5
    thresholdPeriod: 60000
    channels: {webhook: {isEnabled: true, endpoint: "http://127.0.0.1:9/hook", minPeriod: 0}}
`+projectB+`:
  - id: events
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 5
    thresholdPeriod: 60000
    channels: {webhook: {isEnabled: true, endpoint: "http://127.0.0.1:9/hook", minPeriod: 0}}
`)
	env := map[string]string{"KLAXON_REDIS_URL": testenv.RedisURL(), "KLAXON_PREFIX": testenv.KeyPrefix(t), "KLAXON_RULES_FILE": file,
		"KLAXON_EVENTS_MONGO_URL": uri}
	sample := func(project, group, rep string) string {
		id := "null"
		if rep != "" {
			id = fmt.Sprintf("%q", rep)
		}
		return writeTemp(t, "event.json", fmt.Sprintf(`{"projectId":%q,"event":{"title":"TypeError","groupHash":%q,"isNew":%t,"repetitionId":%s}}`,
			project, group, rep == "", id))
	}
	explain := func(rule, ev string) (explanation, string) {
		t.Helper()
		r := klaxon(t, env, "explain", "--rule", rule, "--event", ev, "--json")
		var x explanation
		if err := json.Unmarshal([]byte(r.stdout), &x); err != nil {
			t.Fatalf("%v: %s%s", err, r.stdout, r.stderr)
		}
		return x, klaxon(t, env, "explain", "--rule", rule, "--event", ev).stdout
	}
	const unknown = "65f0a1b2c3d4e5f6a7b8c9d0"
	for _, c := range []struct {
		name, rule, event string
		want              hawkSample
		lacksUser         bool
		says              []string
	}{
		{"a repetition", "users", sample(projectA, "g", bob),
			hawkSample{Read: "repetitions:" + projectA, Time: time.Unix(t0+90, 0).UTC(), UserID: "bob"}, false,
			[]string{"event: no event.timestamp: the worker takes 2023-11-14T22:14:50Z from Hawk's events database (repetitions:" + projectA + ")",
				`event: no event.user: the worker takes user "bob" from Hawk's events database`}},
		{"a group's first", "users", sample(projectA, "g", ""),
			hawkSample{Read: "events:" + projectA, Time: time.Unix(t0, 0).UTC(), UserID: "alice"}, false,
			[]string{"the worker takes 2023-11-14T22:13:20Z from Hawk's events database (events:" + projectA + ")", `takes user "alice"`}},
		{"a repetition it does not hold", "users", sample(projectA, "g", unknown),
			hawkSample{Read: "repetitions:" + projectA, NoTime: "repetition " + unknown + " not found in repetitions:" + projectA}, true,
			[]string{"event: no event.user, and the worker takes none from Hawk's events database: this rule cannot count it",
				"event: no event.timestamp, and the worker takes none from Hawk's events database (repetition " + unknown + " not found in repetitions:" + projectA + "): it counts at its arrival"}},
		{"a project without a users rule", "events", sample(projectB, "p", other),
			hawkSample{NoTime: "the worker reads a repetition only for an event without event.user in a project with a countBy users rule"}, false,
			[]string{"event: no event.timestamp, and the worker takes none from Hawk's events database (the worker reads a repetition only"}},
	} {
		x, out := explain(c.rule, c.event)
		if x.FromHawk == nil || *x.FromHawk != c.want {
			t.Errorf("%s: from Hawk %+v, want %+v", c.name, x.FromHawk, c.want)
		}
		if x.ArrivalTime != c.want.Time.IsZero() || (x.Needs != nil && x.Needs.EventLacks) != c.lacksUser {
			t.Errorf("%s: arrival time %v, needs %+v; want arrival time %v, lacking the user %v", c.name, x.ArrivalTime, x.Needs, c.want.Time.IsZero(), c.lacksUser)
		}
		for _, want := range c.says {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", c.name, want, out)
			}
		}
		if !c.want.Time.IsZero() && (strings.Contains(out, "counts at its arrival") || strings.Contains(out, "event: no event.user,")) {
			t.Errorf("%s: says what the database gives is lacking:\n%s", c.name, out)
		}
	}

	env["KLAXON_EVENTS_MONGO_URL"] = "mongodb://" + closedAddr(t) + "/hawk_events"
	if r := klaxon(t, env, "explain", "--rule", "users", "--event", sample(projectA, "g", bob)); r.code != exitUsage ||
		!strings.Contains(r.stderr, "Hawk's events database (KLAXON_EVENTS_MONGO_URL): MongoDB did not answer") {
		t.Errorf("the database down: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
}
