package counter

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// testRedis is the test Redis (testenv.Redis).
func testRedis(t testing.TB) *redis.Client {
	t.Helper()
	return testenv.Redis(t)
}

// testPrefix is a key prefix of this test alone; its keys are deleted after.
func testPrefix(t testing.TB, rdb redis.UniversalClient) string {
	t.Helper()
	prefix := fmt.Sprintf("klaxontest:%x", rand.Uint64())
	t.Cleanup(func() { deleteKeys(rdb, prefix+":*") })
	return prefix
}

func deleteKeys(rdb redis.UniversalClient, pattern string) {
	ctx := context.Background()
	del := func(c *redis.Client) {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { del(n); return nil })
	case *redis.Client:
		del(c)
	}
}

func mustRule(t testing.TB, spec rules.Spec) *rules.Rule {
	t.Helper()
	if spec.ID == "" {
		spec.ID = fmt.Sprintf("rule%x", rand.Uint32())
	}
	spec.IsEnabled = true
	r, _, err := rules.Compile("5e3eef0679fa3700a0198a49", spec)
	if err != nil {
		t.Fatalf("compile %+v: %v", spec, err)
	}
	return r
}

func seenMore(windows ...rules.WindowSpec) rules.Spec {
	return rules.Spec{WhatToReceive: rules.SeenMore, Windows: windows}
}

const project = "5e3eef0679fa3700a0198a49"

func observe(t testing.TB, e *Engine, events ...Event) []Result {
	t.Helper()
	res, err := e.ObserveBatch(context.Background(), 0, events)
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	return res
}

// The fixed-window trap of DESIGN.md: 1000 in 2 min; 1 event in minute 1,
// 900 in minute 2, 900 in minute 3. A fixed window never sees 1000; the
// sliding one fires once, in minute 3. And 999 in two minutes never fires.
func TestFixedWindowTrap(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 1000, Period: 120_000}))
	start := time.Now().Add(-time.Hour).Truncate(2 * time.Minute)

	minute := func(group string, m, n int) []Event {
		var evs []Event
		for i := range n {
			at := start.Add(time.Duration(m)*time.Minute + time.Duration(i)*time.Minute/time.Duration(n))
			evs = append(evs, Event{ProjectID: project, GroupHash: group, Time: at, Rules: []*rules.Rule{rule}})
		}
		return evs
	}
	count := func(group string, batches ...[]Event) (fired []Result) {
		for _, b := range batches {
			for _, r := range observe(t, e, b...) {
				if r.Outcomes[0].Fired {
					fired = append(fired, r)
				}
			}
		}
		return fired
	}

	fired := count("trap", minute("trap", 0, 1), minute("trap", 1, 900), minute("trap", 2, 900))
	if len(fired) != 1 {
		t.Fatalf("trap: %d firings, want 1", len(fired))
	}
	if got := fired[0].Time; got.Before(start.Add(2*time.Minute)) || got.After(start.Add(3*time.Minute)) {
		t.Errorf("trap fired at %v, want during minute 3 (from %v)", got, start.Add(2*time.Minute))
	}
	if c := fired[0].Outcomes[0].Counts[0]; c != 1000 {
		t.Errorf("trap fired at count %d, want 1000", c)
	}

	if fired := count("under", minute("under", 0, 99), minute("under", 1, 900)); len(fired) != 0 {
		t.Fatalf("999 of 1000 fired %d times", len(fired))
	}
}

// Several windows are checked in one step and the answer says which decided
// and when each resets.
func TestSeveralWindows(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	rule := mustRule(t, seenMore(
		rules.WindowSpec{Threshold: 20, Period: 60_000},
		rules.WindowSpec{Threshold: 5, Period: 3_000},
	))
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)
	var evs []Event
	for i := range 5 { // 5 events within 3 s: the short window fires
		evs = append(evs, Event{ProjectID: project, GroupHash: "g", Time: start.Add(time.Duration(i) * 500 * time.Millisecond), Rules: []*rules.Rule{rule}})
	}
	res := observe(t, e, evs...)
	last := res[4].Outcomes[0]
	if !last.Fired || last.Window != 1 {
		t.Fatalf("5 in 3 s: fired=%v window=%d, want fired by window 1", last.Fired, last.Window)
	}
	if last.Counts[0] != 5 || last.Counts[1] != 5 {
		t.Errorf("counts %v, want [5 5]", last.Counts)
	}
	wantReset := start.Add(2*time.Second + 100*time.Millisecond + 3*time.Second)
	if got := last.ResetAt(1); !got.Equal(wantReset) {
		t.Errorf("short window resets at %v, want %v", got, wantReset)
	}
	if got, want := last.ResetAt(0), start.Add(3*time.Second+60*time.Second); !got.Equal(want) {
		t.Errorf("long window resets at %v, want %v", got, want)
	}
	for i, r := range res[:4] {
		if r.Outcomes[0].Fired {
			t.Errorf("event %d fired before the threshold", i)
		}
	}
}

// A storm above the threshold fires once per cooldown.
func TestStormFiresOncePerCooldown(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	spec := seenMore(rules.WindowSpec{Threshold: 10, Period: 10_000})
	spec.Cooldown = 60_000
	rule := mustRule(t, spec)
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)
	var evs []Event
	for i := range 3000 { // 5 minutes at 10 per second
		evs = append(evs, Event{ProjectID: project, GroupHash: "storm", Time: start.Add(time.Duration(i) * 100 * time.Millisecond), Rules: []*rules.Rule{rule}})
	}
	var fired []time.Time
	for i := 0; i < len(evs); i += 250 {
		for _, r := range observe(t, e, evs[i:i+250]...) {
			if r.Outcomes[0].Fired {
				fired = append(fired, r.Outcomes[0].At)
			}
		}
	}
	if len(fired) != 5 {
		t.Fatalf("storm of 5 min with a 1 min cooldown fired %d times, want 5: %v", len(fired), fired)
	}
	for i := 1; i < len(fired); i++ {
		if d := fired[i].Sub(fired[i-1]); d != time.Minute {
			t.Errorf("firing %d came %v after the previous, want 1m", i, d)
		}
	}
}

// ONLY_NEW fires once per group within 24 h.
func TestOnlyNewOncePerGroup(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	rule := mustRule(t, rules.Spec{WhatToReceive: rules.OnlyNew})
	at := time.Now().Add(-time.Minute)
	evs := []Event{
		{ProjectID: project, GroupHash: "a", Time: at, Rules: []*rules.Rule{rule}},
		{ProjectID: project, GroupHash: "a", Time: at.Add(time.Second), Rules: []*rules.Rule{rule}},
		{ProjectID: project, GroupHash: "b", Time: at, Rules: []*rules.Rule{rule}},
	}
	res := observe(t, e, evs...)
	if !res[0].Outcomes[0].Fired || res[1].Outcomes[0].Fired || !res[2].Outcomes[0].Fired {
		t.Fatalf("fired %v %v %v, want true false true", res[0].Outcomes[0].Fired, res[1].Outcomes[0].Fired, res[2].Outcomes[0].Fired)
	}
	if res[0].Outcomes[0].ID == res[2].Outcomes[0].ID {
		t.Error("two groups' firings share an id")
	}
	if got := res[0].Outcomes[0].Rearm.Sub(res[0].Outcomes[0].At); got != 24*time.Hour {
		t.Errorf("rearm %v after firing, want 24h", got)
	}
	res = observe(t, e, Event{ProjectID: project, GroupHash: "a", Rules: []*rules.Rule{rule}})
	if res[0].Outcomes[0].Fired {
		t.Error("the same group fired again within 24 h")
	}
}

// A redelivered message neither counts nor fires again, and gets its first
// result back.
func TestRedeliveryIsIdempotent(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 2, Period: 60_000}))
	ev := func(id string) Event {
		return Event{ID: id, ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}}
	}
	first := observe(t, e, ev("m1"), ev("m2"))
	if !first[1].Outcomes[0].Fired {
		t.Fatal("second event did not fire a threshold of 2")
	}
	again := observe(t, e, ev("m2"), ev("m1"), ev("m2"))
	for i, r := range again {
		if !r.Duplicate {
			t.Errorf("redelivery %d not reported as duplicate", i)
		}
	}
	if a, b := again[0].Outcomes[0], first[1].Outcomes[0]; !a.Fired || a.ID != b.ID || a.Counts[0] != 2 {
		t.Errorf("replayed outcome %+v, want the first %+v", a, b)
	}
	next := observe(t, e, ev("m3"))
	if c := next[0].Outcomes[0].Counts[0]; c != 3 {
		t.Errorf("count after redeliveries %d, want 3", c)
	}
}

// A repeat whose first observation fired gives each firing to its own rule
// by id, whatever the event's rules are now: a rule edited, added, removed
// or moved between a crash and the redelivery takes no firing that is not
// its own, and loses none that is.
func TestReplayFollowsEachRuleByID(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	fires := mustRule(t, seenMore(rules.WindowSpec{Threshold: 1, Period: 60_000}))
	quiet := mustRule(t, seenMore(rules.WindowSpec{Threshold: 100, Period: 60_000}))
	added := mustRule(t, seenMore(rules.WindowSpec{Threshold: 1, Period: 60_000}))
	ev := func(rs ...*rules.Rule) Event {
		return Event{ID: "m1", ProjectID: project, GroupHash: "g", Rules: rs}
	}
	first := observe(t, e, ev(fires, quiet))[0].Outcomes
	if !first[0].Fired || first[1].Fired {
		t.Fatalf("first observation fired %v %v, want true false", first[0].Fired, first[1].Fired)
	}

	// Reordered, and a rule added that would fire now.
	got := observe(t, e, ev(added, quiet, fires))[0]
	if !got.Duplicate {
		t.Fatal("redelivery not reported as duplicate")
	}
	if o := got.Outcomes[2]; !o.Fired || o.ID != first[0].ID || o.Rule != fires {
		t.Errorf("the firing rule's replay %+v, want its first firing %s", o, first[0].ID)
	}
	if got.Outcomes[0].Fired || got.Outcomes[1].Fired {
		t.Errorf("other rules fired on a replay: %+v", got.Outcomes)
	}
	if o := got.Outcomes[1]; o.Counts != nil || o.Window != -1 {
		t.Errorf("the quiet rule's replay %+v, want an empty outcome: only firings are replayed", o)
	}

	// The firing rule removed: nothing fires, nothing fails.
	got = observe(t, e, ev(quiet))[0]
	if len(got.Outcomes) != 1 || got.Outcomes[0].Fired || got.Outcomes[0].Rule != quiet {
		t.Errorf("replay without the firing rule: %+v", got.Outcomes)
	}

	// The firing rule edited to another period (a new version): still its firing.
	spec := seenMore(rules.WindowSpec{Threshold: 1, Period: 120_000})
	spec.ID = fires.ID
	edited := mustRule(t, spec)
	if edited.Version == fires.Version {
		t.Fatal("a period edit kept the rule's version")
	}
	if o := observe(t, e, ev(edited))[0].Outcomes[0]; !o.Fired || o.ID != first[0].ID {
		t.Errorf("the edited rule's replay %+v, want its first firing %s", o, first[0].ID)
	}

	// Another number of windows: the firing cannot be told in its terms.
	spec = seenMore(rules.WindowSpec{Threshold: 1, Period: 60_000}, rules.WindowSpec{Threshold: 5, Period: 1_000})
	spec.ID = fires.ID
	if o := observe(t, e, ev(mustRule(t, spec)))[0].Outcomes[0]; o.Fired || len(o.Counts) != 0 {
		t.Errorf("replay for a rule with two windows now: %+v, want an empty outcome", o)
	}
}

// An id is remembered for at least DedupTTL, across the slot boundary of its
// slot, and forgotten two slots later.
func TestRedeliveryAcrossDedupSlots(t *testing.T) {
	rdb := testRedis(t)
	ttl := 300 * time.Millisecond
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb), DedupTTL: ttl})
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 100, Period: 60_000}))
	waitSlot, in := dedupSlots(t, rdb, e, ttl)

	for attempt := range 5 {
		ev := Event{ID: fmt.Sprint("m", attempt), ProjectID: project, GroupHash: fmt.Sprint("g", attempt),
			Rules: []*rules.Rule{rule}}
		r, first := in(ev)
		if first < 0 {
			continue
		}
		if r.Duplicate {
			t.Fatal("first delivery reported as duplicate")
		}

		waitSlot(first + 1)
		if r, s := in(ev); s != first+1 {
			continue
		} else if !r.Duplicate || r.Outcomes[0].Fired {
			t.Errorf("redelivery in the next slot: %+v, want a duplicate", r)
		}
		waitSlot(first + 2)
		r, s := in(ev)
		if s != first+2 {
			continue
		}
		if r.Duplicate || r.Outcomes[0].Counts[0] != 2 {
			t.Errorf("redelivery two slots later: %+v, want counted again (2)", r)
		}
		return
	}
	t.Fatal("no attempt kept each call inside one slot")
}

// A batch of more groups than one script call holds is split over calls of
// GroupsPerCall groups (one each behind a key-routing proxy), and every
// result still lands on its own event.
func TestManyGroupsInOneBatch(t *testing.T) {
	rdb := testRedis(t)
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 2, Period: 60_000}))
	const groups = 103
	start := time.Now().Add(-time.Minute).Truncate(time.Second)
	for _, tc := range []struct{ option, per int }{{0, 32}, {16, 16}, {1, 1}} {
		t.Run(fmt.Sprint("GroupsPerCall=", tc.option), func(t *testing.T) {
			e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb), GroupsPerCall: tc.option})
			var evs []Event
			for round := range 2 {
				for g := range groups {
					evs = append(evs, Event{ID: fmt.Sprint("m", round, "-", g), ProjectID: project,
						GroupHash: fmt.Sprint("g", g), Time: start.Add(time.Duration(g) * time.Millisecond),
						Rules: []*rules.Rule{rule}})
				}
			}
			evs = append(evs, Event{ID: "no-rules", ProjectID: project, GroupHash: "g0"})
			b := &batch{events: evs, keys: make([]string, len(evs)), modes: make([]string, len(evs))}
			calls := e.plan(b, e.group(b))
			if want := (groups + tc.per - 1) / tc.per; len(calls) != want {
				t.Fatalf("%d script calls for %d groups, want %d", len(calls), groups, want)
			}
			res := observe(t, e, evs...)
			for i, r := range res[:len(evs)-1] {
				o := r.Outcomes[0]
				wantFired := i >= groups
				if o.Counts[0] != int64(1+i/groups) || o.Fired != wantFired {
					t.Fatalf("event %d (%s in %s): count %d fired %v, want %d and %v",
						i, evs[i].ID, evs[i].GroupHash, o.Counts[0], o.Fired, 1+i/groups, wantFired)
				}
				if !o.At.Equal(evs[i].Time) {
					t.Fatalf("event %d: clock %v, want its own time %v", i, o.At, evs[i].Time)
				}
			}
			if last := res[len(res)-1]; last.Outcomes != nil {
				t.Errorf("event without rules got %+v", last)
			}
		})
	}
}

// countBy users counts distinct users, and events without a user not at all.
func TestCountUsers(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	spec := seenMore(rules.WindowSpec{Threshold: 3, Period: 60_000})
	spec.CountBy = rules.CountUsers
	rule := mustRule(t, spec)
	at := time.Now().Add(-time.Hour)
	var evs []Event
	for i, u := range []string{"ann", "ann", "", "bob", "ann", "bob", "cid"} {
		evs = append(evs, Event{ProjectID: project, GroupHash: "g", UserID: u, Time: at.Add(time.Duration(i) * time.Second), Rules: []*rules.Rule{rule}})
	}
	res := observe(t, e, evs...)
	var counts []int64
	for _, r := range res {
		counts = append(counts, r.Outcomes[0].Counts[0])
	}
	if fmt.Sprint(counts) != "[1 1 1 2 2 2 3]" {
		t.Errorf("distinct users %v, want [1 1 1 2 2 2 3]", counts)
	}
	if !res[6].Outcomes[0].Fired {
		t.Error("third distinct user did not fire")
	}
}

// Memory per (rule, group) stays bounded whatever the rate.
func TestMemoryBounded(t *testing.T) {
	rdb := testRedis(t)
	prefix := testPrefix(t, rdb)
	e := New(rdb, Options{Verbose: true, Prefix: prefix})
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 1_000_000, Period: 60_000}))
	start := time.Now().Add(-time.Hour)
	for batch := range 40 {
		evs := make([]Event, 1000)
		for i := range evs {
			n := batch*1000 + i
			evs[i] = Event{ProjectID: project, GroupHash: "mem", Time: start.Add(time.Duration(n) * 6 * time.Millisecond), Rules: []*rules.Rule{rule}}
		}
		observe(t, e, evs...)
	}
	keys, err := rdb.Keys(context.Background(), prefix+":*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v (%v), want one state key", keys, err)
	}
	mem, err := rdb.MemoryUsage(context.Background(), keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if mem > 2048 {
		t.Errorf("MEMORY USAGE after 40,000 events in 4 min: %d bytes, want ≤ 2048", mem)
	}
	ttl := rdb.PTTL(context.Background(), keys[0]).Val()
	if ttl <= 60*time.Second || ttl > 62*time.Second {
		t.Errorf("TTL %v, want just over the 60 s window", ttl)
	}
}

// randomRule draws a rule for the differential test.
func randomRule(t testing.TB, rng *rand.Rand) *rules.Rule {
	if rng.IntN(6) == 0 {
		return mustRule(t, rules.Spec{WhatToReceive: rules.OnlyNew})
	}
	periods := []int64{1000, 1500, 3000, 7000, 10_000, 60_000, 61_000, 300_000}
	var ws []rules.WindowSpec
	for range 1 + rng.IntN(3) {
		ws = append(ws, rules.WindowSpec{Threshold: 1 + rng.Int64N(25), Period: periods[rng.IntN(len(periods))]})
	}
	spec := seenMore(ws...)
	if rng.IntN(4) == 0 {
		spec.CountBy = rules.CountUsers
	} else {
		for i := range spec.Windows {
			if rng.IntN(2) == 0 {
				spec.Windows[i].Spike = randomSpike(rng, spec.Windows[i].Period, periods)
			}
		}
	}
	switch rng.IntN(4) {
	case 0:
		spec.Including = []string{"db"}
	case 1:
		spec.Excluding = []string{"staging"}
	}
	if rng.IntN(2) == 0 {
		spec.Cooldown = rng.Int64N(120_000)
	}
	return mustRule(t, spec)
}

// randomSpike draws a spike for a window of period ms: a baseline a few
// periods long (a few seconds to minutes, as long as the streams), often
// the period of another window, so that rings are shared.
func randomSpike(rng *rand.Rand, period int64, periods []int64) *rules.SpikeSpec {
	factor := []float64{1.1, 1.5, 2, 3, 5, 7.25}[rng.IntN(6)]
	least := int64(math.Ceil(factor * float64(period)))
	sp := &rules.SpikeSpec{Factor: factor, Floor: []int64{0, 0, 1, 2, 5}[rng.IntN(5)]}
	if p := periods[rng.IntN(len(periods))]; p >= least && rng.IntN(2) == 0 {
		sp.Baseline = p
	} else {
		sp.Baseline = least + rng.Int64N(20*period)
	}
	return sp
}

// exact counts, for the resolution bound: events with time in (from, to].
func exactCount(times []int64, from, to int64) int64 {
	var n int64
	for _, at := range times {
		if at > from && at <= to {
			n++
		}
	}
	return n
}

// TestModelAgreesWithLua drives the model and the Lua engine with random
// streams — several windows, late events, users, redeliveries, random
// batches — and requires identical results, and counts within the
// resolution bound of an exact count.
func TestModelAgreesWithLua(t *testing.T) {
	rdb := testRedis(t)
	differential(t, rdb, 300, 1)
}

func differential(t *testing.T, rdb redis.UniversalClient, streams int, seed uint64) {
	ctx := context.Background()
	var fast, script, cached, changed int64
	var sp spikes
	for s := range streams {
		rng := rand.New(rand.NewPCG(seed, uint64(s)))
		// Every other stream is told only its firings, as the worker is.
		verbose := s%2 == 0
		// Every fifth has no ids: every delivery counts, redeliveries too.
		idless := s%5 == 4
		e := New(rdb, Options{Verbose: verbose, Prefix: testPrefix(t, rdb)})
		// Every third stream is counted by the script alone; the others
		// mostly in the worker, the script taking repeats and conflicts.
		e.scriptOnly = s%3 == 1
		if s%4 == 3 {
			// Groups of more events go to the script in chunks.
			e.eventsPerCall = 1 + s%5
		}
		// Every third stream's batches go in turn to three workers with
		// state caches (some too small to hold a group's state for long),
		// each cache made stale by the two others' writes.
		engines, batches := []*Engine{e}, 0
		if s%3 == 2 {
			engines = nil
			for k := range 3 {
				w := New(rdb, Options{Verbose: verbose, Prefix: e.prefix, StateCacheBytes: int64(300 << (4 * k))})
				w.eventsPerCall = e.eventsPerCall
				engines = append(engines, w)
			}
		}
		model := NewModel()
		var rs []*rules.Rule
		for range 1 + rng.IntN(4) {
			rs = append(rs, randomRule(t, rng))
		}
		titles := []string{"DB timeout", "db down in staging", "TypeError", "staging TypeError"}
		groups := []string{"g1", "g2", "g3", "g4", "g5", "g6"}[:1+rng.IntN(6)]
		users := []string{"", "u1", "u2", "u3", "u4", "u5", "u6", "u7"}[:1+rng.IntN(8)]
		clock := time.Now().Add(-3 * time.Hour).UnixMilli()
		var sent []Event
		times := map[string][]int64{} // group -> counted event times (exact)
		n := 50 + rng.IntN(300)
		for len(sent) < n {
			batch := make([]Event, 1+rng.IntN(40))
			for i := range batch {
				if len(sent) > 0 && rng.IntN(15) == 0 {
					batch[i] = sent[rng.IntN(len(sent))] // a redelivery
					batch[i].Redelivered = rng.IntN(2) == 0
					continue
				}
				switch rng.IntN(20) {
				case 0:
					clock += rng.Int64N(600_000) // a quiet spell
				case 1, 2:
					// late event: below
				default:
					clock += rng.Int64N(400)
				}
				at := clock
				if rng.IntN(10) == 0 {
					at -= rng.Int64N(120_000)
				}
				// Rules match by their filters, as the evaluator's do:
				// rules of one filter count the same events and share rings.
				title, isNew := titles[rng.IntN(len(titles))], rng.IntN(3) == 0
				var matched []*rules.Rule
				for _, r := range rs {
					if r.Matches(title, isNew) {
						matched = append(matched, r)
					}
				}
				id := fmt.Sprintf("m%d", len(sent)+i)
				if idless {
					id = ""
				}
				batch[i] = Event{
					ID:        id,
					Body:      []byte(fmt.Sprintf("body%d", rng.IntN(1000))),
					ProjectID: project,
					GroupHash: groups[rng.IntN(len(groups))],
					UserID:    users[rng.IntN(len(users))],
					Time:      time.UnixMilli(at),
					Rules:     matched,
				}
			}
			got, err := engines[batches%len(engines)].ObserveBatch(ctx, 0, batch)
			batches++
			if err != nil {
				t.Fatalf("stream %d: %v", s, err)
			}
			for i, ev := range batch {
				if len(ev.Rules) == 0 {
					if got[i].Time.IsZero() && got[i].Outcomes == nil {
						continue
					}
					t.Fatalf("stream %d event %s matched no rule but has result %+v", s, ev.ID, got[i])
				}
				want := model.Observe(ev, got[i].Time)
				for _, o := range want.Outcomes {
					sp.add(o)
				}
				if !verbose {
					want = firingsOnly(want)
				}
				if !ev.Time.Equal(got[i].Time) {
					t.Fatalf("stream %d event %s: counted at %v, sent %v", s, ev.ID, got[i].Time, ev.Time)
				}
				if err := sameResult(got[i], want); err != nil {
					t.Fatalf("stream %d event %s (group %s, t=%d, user %q): %v", s, ev.ID, ev.GroupHash, ev.Time.UnixMilli(), ev.UserID, err)
				}
				if !want.Duplicate && verbose && !idless {
					times[ev.GroupHash] = append(times[ev.GroupHash], ev.Time.UnixMilli())
					for k, o := range want.Outcomes {
						if err := withinResolution(o, ev, times, rs, sent, batch[:i]); err != nil {
							t.Fatalf("stream %d event %s rule %d: %v", s, ev.ID, k, err)
						}
					}
				}
			}
			sent = append(sent, batch...)
		}
		if e.scriptOnly && e.fastGroups.Load() != 0 {
			t.Fatalf("stream %d: groups counted in the worker with scriptOnly", s)
		}
		for _, w := range engines {
			fast, script = fast+w.fastGroups.Load(), script+w.scriptGroups.Load()
			cached, changed = cached+w.cachedStates.Load(), changed+w.changedStates.Load()
		}
	}
	if fast == 0 || script == 0 {
		t.Fatalf("groups counted in the worker %d, by the script %d: want both paths tried", fast, script)
	}
	t.Logf("states from a cache: %d, answered changed by cas.lua: %d", cached, changed)
	if streams >= 30 && (cached == 0 || changed == 0) {
		t.Fatalf("states from a cache %d, answered changed %d: want both paths tried", cached, changed)
	}
	t.Logf("spike windows over their threshold: %d reached, %d held back", sp.reached, sp.held)
	if streams >= 100 && (sp.reached == 0 || sp.held == 0) {
		t.Fatalf("spike windows over their threshold: %d reached, %d held back by the spike: want both", sp.reached, sp.held)
	}
}

// firingsOnly is a verbose result as a plain engine reports it: firings,
// and for the other rules an empty outcome.
func firingsOnly(r Result) Result {
	for i, o := range r.Outcomes {
		if !o.Fired {
			r.Outcomes[i] = Outcome{Rule: o.Rule, Window: -1}
		}
	}
	return r
}

// withinResolution checks an events-counting outcome against an exact count
// of the rule's events in the window ending at the rule's clock.
func withinResolution(o Outcome, ev Event, _ map[string][]int64, _ []*rules.Rule, sent, before []Event) error {
	if o.Rule.Users {
		return nil
	}
	var times []int64
	seen := map[string]bool{}
	for _, list := range [][]Event{sent, before, {ev}} {
		for _, x := range list {
			if x.GroupHash != ev.GroupHash || seen[x.ID] || !hasRule(x.Rules, o.Rule) {
				continue
			}
			seen[x.ID] = true
			times = append(times, x.Time.UnixMilli())
		}
	}
	at := o.At.UnixMilli()
	for i, period := range ringPeriods(o.Rule) {
		p, r := period.Milliseconds(), Resolution(period).Milliseconds()
		inside, loose := exactCount(times, at-p, at), exactCount(times, at-p-r, at)
		if o.Counts[i] < inside || o.Counts[i] > loose {
			return fmt.Errorf("count %d (%s): %d, exact %d, with resolution %d", i, period, o.Counts[i], inside, loose)
		}
	}
	return nil
}

// spikes tells, of an outcome's spike windows at or over their threshold,
// how many fired and how many their spike held back: a differential test
// that never saw both did not test spikes.
type spikes struct{ reached, held int }

func (s *spikes) add(o Outcome) {
	for i, w := range o.Rule.Windows {
		if w.Spike == nil || len(o.Counts) == 0 || o.Counts[i] < w.Threshold {
			continue
		}
		if w.Reached(o.Counts[i], o.Baseline(i)) {
			s.reached++
		} else {
			s.held++
		}
	}
}

func hasRule(rs []*rules.Rule, r *rules.Rule) bool {
	for _, x := range rs {
		if x.ID == r.ID && x.Version == r.Version {
			return true
		}
	}
	return false
}

func sameResult(got, want Result) error {
	if got.Duplicate != want.Duplicate {
		return fmt.Errorf("duplicate %v, model %v", got.Duplicate, want.Duplicate)
	}
	if len(got.Outcomes) != len(want.Outcomes) {
		return fmt.Errorf("%d outcomes, model %d", len(got.Outcomes), len(want.Outcomes))
	}
	for i := range got.Outcomes {
		g, w := got.Outcomes[i], want.Outcomes[i]
		if g.Fired != w.Fired || g.Replayed != w.Replayed || g.Window != w.Window || g.ID != w.ID || !g.At.Equal(w.At) ||
			!g.Rearm.Equal(w.Rearm) || fmt.Sprint(g.Counts) != fmt.Sprint(w.Counts) {
			return fmt.Errorf("rule %d (%s):\n engine fired=%v window=%d counts=%v at=%d rearm=%d id=%s\n model  fired=%v window=%d counts=%v at=%d rearm=%d id=%s",
				i, describe(g.Rule), g.Fired, g.Window, g.Counts, g.At.UnixMilli(), g.Rearm.UnixMilli(), g.ID,
				w.Fired, w.Window, w.Counts, w.At.UnixMilli(), w.Rearm.UnixMilli(), w.ID)
		}
	}
	return nil
}

func describe(r *rules.Rule) string {
	var b strings.Builder
	fmt.Fprintf(&b, "users=%v cooldown=%s", r.Users, r.Cooldown)
	for _, w := range r.Windows {
		fmt.Fprintf(&b, " %d/%s", w.Threshold, w.Period)
		if sp := w.Spike; sp != nil {
			fmt.Fprintf(&b, "(spike %v× over %s, floor %d)", sp.Factor, sp.Baseline, sp.Floor)
		}
	}
	return b.String()
}

// After a restart or failover Redis has forgotten the script: the engine
// loads it again and loses nothing.
func TestScriptReloaded(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 2, Period: 60_000}))
	ev := Event{ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}}
	observe(t, e, ev)
	if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	res := observe(t, e, ev, ev)
	if c := res[1].Outcomes[0].Counts[0]; c != 3 {
		t.Errorf("count %d after the script was flushed, want 3", c)
	}
}

// A rule reloaded mid-batch arrives as another pointer with the same id and
// version: both copies count into one state.
func TestReloadedRuleSharesState(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	spec := seenMore(rules.WindowSpec{Threshold: 10, Period: 60_000})
	spec.ID = "reloaded"
	a, b := mustRule(t, spec), mustRule(t, spec)
	res := observe(t, e,
		Event{ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{a}},
		Event{ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{b}},
	)
	if c := res[1].Outcomes[0].Counts[0]; c != 2 {
		t.Errorf("count %d, want 2", c)
	}
	if res[1].Outcomes[0].Rule != b {
		t.Error("outcome does not point at the event's own rule")
	}
}

// Timestamps out of range: one before 1970 counts at 1970, where no later
// window reaches it; one too far ahead for int64 ms (nanoseconds sent as
// seconds) is clamped to Redis' now like any future one.
func TestTimestampsOutOfRange(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 2, Period: 60_000}))
	ev := func(group string, at time.Time) Event {
		return Event{ProjectID: project, GroupHash: group, Time: at, Rules: []*rules.Rule{rule}}
	}
	res := observe(t, e, ev("old", time.Unix(0, 0)), ev("old", time.Unix(-5, 0)), ev("old", time.Time{}))
	if o := res[2].Outcomes[0]; o.Counts[0] != 1 || o.Fired {
		t.Errorf("an event now after two of 1970: count %d fired %v, want 1 and not fired", o.Counts[0], o.Fired)
	}

	before := time.Now().Add(-time.Second)
	future := time.Unix(1_764_000_000_000_000_000, 0)
	res = observe(t, e, ev("future", future), ev("future", future))
	if got := res[0].Time; got.Before(before) || got.After(time.Now().Add(time.Second)) {
		t.Errorf("a time of year %d counted at %v, want Redis' now", future.Year(), got)
	}
	if o := res[1].Outcomes[0]; o.Counts[0] != 2 || !o.Fired {
		t.Errorf("two events from the far future: count %d fired %v, want 2 and fired", o.Counts[0], o.Fired)
	}
}

// The differential test at the edges: periods of 1 s and 31 days and not a
// multiple of their bucket, up to 4 windows, cooldowns of 1 ms and 31 days,
// events months late or of 1970, repeats within a batch, events without an
// id, and calls of 1 to 40 groups.
func TestModelAgreesWithLuaAtTheEdges(t *testing.T) {
	rdb := testRedis(t)
	ctx := context.Background()
	const day = 86_400_000
	periods := []int64{1000, 1001, 1099, 6001, 59_999, day, 7*day + 13, 31 * day}
	const streams = 150
	var fast, script int64
	var sp spikes
	for s := range streams {
		rng := rand.New(rand.NewPCG(11, uint64(s)))
		e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb), GroupsPerCall: 1 + rng.IntN(40)})
		e.scriptOnly = s%3 == 1
		if s%4 == 3 {
			// Groups of more events go to the script in chunks.
			e.eventsPerCall = 1 + s%5
		}
		model := NewModel()
		var rs []*rules.Rule
		for range 1 + rng.IntN(4) {
			if rng.IntN(8) == 0 {
				rs = append(rs, mustRule(t, rules.Spec{WhatToReceive: rules.OnlyNew}))
				continue
			}
			var ws []rules.WindowSpec
			for range 1 + rng.IntN(4) {
				ws = append(ws, rules.WindowSpec{Threshold: 1 + rng.Int64N(30), Period: periods[rng.IntN(len(periods))]})
			}
			spec := seenMore(ws...)
			if rng.IntN(3) == 0 {
				spec.CountBy = rules.CountUsers
			} else {
				for i, w := range spec.Windows {
					if rng.IntN(2) == 0 {
						spec.Windows[i].Spike = edgeSpike(rng, w.Period)
					}
				}
			}
			spec.Cooldown = []int64{0, 1, 31 * day, rng.Int64N(100_000)}[rng.IntN(4)]
			rs = append(rs, mustRule(t, spec))
		}
		groups := []string{"g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8"}[:1+rng.IntN(8)]
		users := []string{"", "u1", "u2", "u3", "u4", "u5"}[:1+rng.IntN(6)]
		clock := time.Now().Add(-100 * 24 * time.Hour).UnixMilli()
		var sent []Event
		for n := 50 + rng.IntN(400); len(sent) < n; {
			batch := make([]Event, 1+rng.IntN(60))
			for i := range batch {
				switch {
				case len(sent) > 0 && rng.IntN(15) == 0:
					batch[i] = sent[rng.IntN(len(sent))]
					continue
				case i > 0 && rng.IntN(20) == 0:
					batch[i] = batch[rng.IntN(i)]
					continue
				}
				switch rng.IntN(20) {
				case 0:
					clock += rng.Int64N(10 * day)
				case 1:
					clock += rng.Int64N(600_000)
				case 2:
					clock += 100 - clock%100 // onto a bucket boundary
				default:
					clock += rng.Int64N(400)
				}
				at := clock
				switch rng.IntN(25) {
				case 0, 1:
					at -= rng.Int64N(120_000)
				case 2:
					at -= rng.Int64N(40 * day)
				case 3:
					at = 0
				}
				var matched []*rules.Rule
				for _, r := range rs {
					if rng.IntN(4) != 0 {
						matched = append(matched, r)
					}
				}
				id := fmt.Sprintf("m%d", len(sent)+i)
				if rng.IntN(10) == 0 {
					id = ""
				}
				batch[i] = Event{ID: id, ProjectID: project, GroupHash: groups[rng.IntN(len(groups))],
					UserID: users[rng.IntN(len(users))], Time: time.UnixMilli(at), Rules: matched}
			}
			got, err := e.ObserveBatch(ctx, 0, batch)
			if err != nil {
				t.Fatalf("stream %d: %v", s, err)
			}
			for i, ev := range batch {
				if len(ev.Rules) == 0 {
					continue
				}
				want := model.Observe(ev, got[i].Time)
				for _, o := range want.Outcomes {
					sp.add(o)
				}
				if err := sameResult(got[i], want); err != nil {
					t.Fatalf("stream %d event %d %q (group %s, t=%d, user %q): %v",
						s, i, ev.ID, ev.GroupHash, ev.Time.UnixMilli(), ev.UserID, err)
				}
			}
			sent = append(sent, batch...)
		}
		if e.scriptOnly && e.fastGroups.Load() != 0 {
			t.Fatalf("stream %d: groups counted in the worker with scriptOnly", s)
		}
		fast, script = fast+e.fastGroups.Load(), script+e.scriptGroups.Load()
	}
	if fast == 0 || script == 0 {
		t.Fatalf("groups counted in the worker %d, by the script %d: want both paths tried", fast, script)
	}
	t.Logf("spike windows over their threshold: %d reached, %d held back", sp.reached, sp.held)
	if sp.reached == 0 || sp.held == 0 {
		t.Fatalf("spike windows over their threshold: %d reached, %d held back by the spike: want both", sp.reached, sp.held)
	}
}

// edgeSpike draws a spike at the bounds: factors just above 1 and 1000,
// baselines of exactly factor × period and of 31 days, floors of 0 and the
// largest; nil where no baseline fits (a period of 31 days).
func edgeSpike(rng *rand.Rand, period int64) *rules.SpikeSpec {
	const most = int64(rules.MaxWindowPeriod / time.Millisecond)
	factor := []float64{1.000001, 1.5, 7.3, 999.99, rules.MaxSpikeFactor}[rng.IntN(5)]
	least := int64(math.Ceil(factor * float64(period)))
	if least > most || period == most {
		return nil
	}
	sp := &rules.SpikeSpec{Factor: factor, Floor: []int64{0, 1, 3, rules.MaxThreshold}[rng.IntN(4)]}
	switch rng.IntN(3) {
	case 0:
		sp.Baseline = max(least, period+1)
	case 1:
		sp.Baseline = most
	default:
		sp.Baseline = least + rng.Int64N(most-least+1)
	}
	return sp
}

// A write in the next slot that remembers no new id (an event without one,
// a replay) leaves the current slot empty: the ids of the slot before,
// kept as the previous one, must still be found. They were dropped on the
// next read, and a redelivery then counted again — while the rule stayed in
// the cooldown of a firing that the lost attempt never delivered, a miss.
func TestPreviousSlotKeptBehindAnEmptyCurrentOne(t *testing.T) {
	rdb := testRedis(t)
	ttl := 300 * time.Millisecond
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 100, Period: 60_000}))
	for _, scriptOnly := range []bool{false, true} {
		t.Run(fmt.Sprint("scriptOnly=", scriptOnly), func(t *testing.T) {
			e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb), DedupTTL: ttl})
			e.scriptOnly = scriptOnly
			waitSlot, in := dedupSlots(t, rdb, e, ttl)
			for attempt := range 5 {
				group := fmt.Sprint("g", attempt)
				withID := Event{ID: "m" + group, ProjectID: project, GroupHash: group, Rules: []*rules.Rule{rule}}
				without := Event{Body: []byte("b" + group), ProjectID: project, GroupHash: group, Rules: []*rules.Rule{rule}}
				_, first := in(withID)
				if first < 0 {
					continue
				}
				waitSlot(first + 1)
				if _, s := in(without); s != first+1 {
					continue
				}
				r, s := in(withID)
				if s != first+1 {
					continue
				}
				if !r.Duplicate {
					t.Errorf("redelivery in the next slot, after a write without new ids: %+v, want a duplicate", r)
				}
				return
			}
			t.Fatal("no attempt kept each call inside one slot")
		})
	}
}

// dedupSlots gives a test of de-duplication slots of ttl two steps:
// waitSlot waits until Redis' clock is in slot s, and in observes ev with e
// and says in which slot it ran, or -1 when a slot boundary passed during
// the call (a busy machine): the step is then ambiguous, and the test's
// attempt starts over with a new id.
func dedupSlots(t *testing.T, rdb *redis.Client, e *Engine, ttl time.Duration) (waitSlot func(int64), in func(Event) (Result, int64)) {
	slot := func() int64 { return rdb.Time(context.Background()).Val().UnixMilli() / ttl.Milliseconds() }
	waitSlot = func(s int64) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("Redis' clock in slot %d", s), func() bool { return slot() >= s })
	}
	in = func(ev Event) (Result, int64) {
		before := slot()
		r := observe(t, e, ev)[0]
		if slot() != before {
			return r, -1
		}
		return r, before
	}
	return waitSlot, in
}

// The tags name state in Redis: worked out by hand, they are still 64-bit
// FNV-1a of their parts, each followed by a zero byte, cut to 46 bits, as
// hash/fnv gives them.
func TestTagsAreFNV1a(t *testing.T) {
	want := func(parts ...string) int64 {
		h := fnv.New64a()
		for _, p := range parts {
			h.Write([]byte(p))
			h.Write([]byte{0})
		}
		return int64(h.Sum64() >> 18)
	}
	for _, spec := range []rules.Spec{
		{ID: "rule-1", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 10, ThresholdPeriod: 60_000},
		{ID: "656f1c2a9b1e8a0012345678", IsEnabled: true, WhatToReceive: rules.SeenMore, Including: []string{"Database", "timeout"}, Excluding: []string{"staging"},
			Windows: []rules.WindowSpec{{Threshold: 5, Period: 1000}, {Threshold: 100, Period: 86_400_000}}},
		{ID: "ünïcode ✓", IsEnabled: true, WhatToReceive: rules.OnlyNew},
	} {
		r, _, err := rules.Compile("656f1c2a9b1e8a0087654321", spec)
		if err != nil {
			t.Fatal(err)
		}
		if got, w := stateTag(r), want("state", r.ID, r.Version); got != w {
			t.Errorf("%s: stateTag %d, want %d", r.ID, got, w)
		}
		if got, w := idTag(r), want("rule", r.ID); got != w {
			t.Errorf("%s: idTag %d, want %d", r.ID, got, w)
		}
		for _, win := range r.Windows {
			if got, w := ringTag(r, win.Period), want("ring", r.FilterKey(), strconv.FormatInt(win.Period.Milliseconds(), 10)); got != w {
				t.Errorf("%s: ringTag(%v) %d, want %d", r.ID, win.Period, got, w)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { tag46("state", "rule-1", "3") }); n != 0 {
		t.Errorf("tag46 allocates %v times", n)
	}
}
