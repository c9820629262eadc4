package counter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// A producer that sends the same body for every occurrence, with neither a
// message-id nor a repetitionId, must still be told when its error storms:
// identical bodies are distinct occurrences, and each counts. Taking them
// for redeliveries of one message silenced every such threshold. (That the
// evaluator gives such messages no id is TestHandleIdentity's part; here,
// that the engine, by either path, neither dedups them by body nor takes
// them for a resent call.)
func TestIdenticalBodiesWithoutIDsAllCount(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Prefix: testPrefix(t, rdb)})
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 50, Period: 60_000}))
	body := []byte(fmt.Sprintf(`{"projectId":%q,"event":{"title":"t","groupHash":"g"}}`, project))
	var fired int
	for range 5 {
		evs := make([]Event, 20)
		for i := range evs {
			evs[i] = Event{Body: body, ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}}
		}
		for _, r := range observe(t, e, evs...) {
			if r.Duplicate {
				t.Fatal("an id-less event was taken for a duplicate")
			}
			if r.Outcomes[0].Fired {
				fired++
			}
		}
	}
	if fired != 1 {
		t.Errorf("100 identical bodies fired a threshold of 50 %d times, want once", fired)
	}
}

// A worker that counted an id-less event, fired, and died before it
// published the delivery jobs leaves the message unacked; its redelivery
// must bring the firing back (same id), or a new group's notification is
// lost for good: the rule is in its 24-hour cooldown. Hawk's new events
// carry no repetitionId, so this is the common case.
func TestRedeliveredBodyReplaysItsFiring(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Prefix: testPrefix(t, rdb)})
	rule := mustRule(t, rules.Spec{WhatToReceive: rules.OnlyNew})
	body := []byte("new error")
	ev := Event{Body: body, ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}}
	first := observe(t, e, ev)[0].Outcomes[0]
	if !first.Fired {
		t.Fatal("a new group did not fire ONLY_NEW")
	}

	again := ev
	if o := observe(t, e, again)[0].Outcomes[0]; o.Fired {
		t.Errorf("a second delivery that the broker did not mark redelivered fired: %+v", o)
	}
	again.Redelivered = true
	r := observe(t, e, again)[0]
	if o := r.Outcomes[0]; r.Duplicate || !o.Fired || !o.Replayed || o.ID != first.ID {
		t.Errorf("redelivery: %+v, want the first firing %s replayed", r, first.ID)
	}
	other := Event{Body: []byte("another error"), Redelivered: true, ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}}
	if o := observe(t, e, other)[0].Outcomes[0]; o.Fired {
		t.Errorf("a redelivered body that never fired got a firing: %+v", o)
	}
}

// go-redis may send a pipeline again when a reply is lost; the script must
// then count nothing twice, ids or not, and give back the same firings. So
// must a state stored by the fast path and then counted again by the
// script, which is where a resent cas.lua leads.
func TestCallSentTwiceCountsOnce(t *testing.T) {
	for _, scriptOnly := range []bool{false, true} {
		t.Run(fmt.Sprint("scriptOnly=", scriptOnly), func(t *testing.T) {
			rdb := testRedis(t)
			ctx := context.Background()
			e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
			e.scriptOnly = scriptOnly
			rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 3, Period: 60_000}))
			evs := []Event{
				{Body: []byte("a"), ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}},
				{Body: []byte("a"), ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}},
				{ID: "m1", ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}},
				{Body: []byte("b"), ProjectID: project, GroupHash: "h", Rules: []*rules.Rule{rule}},
			}
			first, err := e.ObserveBatch(ctx, 12345, evs)
			if err != nil {
				t.Fatal(err)
			}
			if !first[2].Outcomes[0].Fired {
				t.Fatalf("the third event of g did not fire a threshold of 3: %+v", first[2])
			}
			second, err := e.ObserveBatch(ctx, 12345, evs)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range second {
				if !r.Duplicate {
					t.Errorf("event %d sent again counted again", i)
				}
			}
			if o := second[2].Outcomes[0]; !o.Fired || o.ID != first[2].Outcomes[0].ID {
				t.Errorf("sent again: %+v, want the firing %s again", o, first[2].Outcomes[0].ID)
			}
			next := observe(t, e, Event{Body: []byte("c"), ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}})
			if c := next[0].Outcomes[0].Counts[0]; c != 4 {
				t.Errorf("count after the second sending %d, want 4", c)
			}
		})
	}
}

// Ids of a busy group leave its state string for pages that split as they
// fill: every id is still recognised, no page grows past a few kilobytes,
// and an id costs at most 16 bytes of Redis, pages and keys included; the
// same whether the worker (fast path) or the script wrote them.
func TestIDsOfABusyGroupStaySmall(t *testing.T) {
	for _, scriptOnly := range []bool{false, true} {
		t.Run(fmt.Sprint("scriptOnly=", scriptOnly), func(t *testing.T) {
			busyGroupIDs(t, scriptOnly)
		})
	}
}

func busyGroupIDs(t *testing.T, scriptOnly bool) {
	rdb := testRedis(t)
	ctx := context.Background()
	prefix := testPrefix(t, rdb)
	e := New(rdb, Options{Prefix: prefix})
	e.scriptOnly = scriptOnly
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 1_000_000, Period: 60_000}))
	const ids, batch = 20_000, 500
	ev := func(i int) Event {
		return Event{ID: fmt.Sprint("busy-", i), ProjectID: project, GroupHash: "busy", Rules: []*rules.Rule{rule}}
	}
	for lo := 0; lo < ids; lo += batch {
		evs := make([]Event, batch)
		for i := range evs {
			evs[i] = ev(lo + i)
		}
		for i, r := range observe(t, e, evs...) {
			if r.Duplicate {
				t.Fatalf("first delivery of %s taken for a duplicate", evs[i].ID)
			}
		}
	}
	if n := e.fastGroups.Load(); !scriptOnly && n != ids/batch {
		t.Errorf("%d of %d batches counted in the worker, want all: pages are the worker's too", n, ids/batch)
	}
	var pageBytes int64
	pages := 0
	iter := rdb.Scan(ctx, 0, prefix+":*}:d:*", 1000).Iterator()
	for iter.Next(ctx) {
		pages++
		n := rdb.StrLen(ctx, iter.Val()).Val()
		if n > 64*8*8 {
			t.Errorf("page %s holds %d bytes, want a few KiB at most", iter.Val(), n)
		}
		pageBytes += rdb.MemoryUsage(ctx, iter.Val(), 0).Val()
	}
	if pages < ids/(2*128) {
		t.Fatalf("%d pages for %d ids, want them spread over at least %d", pages, ids, ids/256)
	}
	if per := float64(pageBytes) / ids; per > 16 {
		t.Errorf("ids cost %.1f B each in %d pages, want at most 16", per, pages)
	}
	// Every id is known again, in any order and any batch.
	for lo := ids - 1; lo >= 0; lo -= 700 {
		var evs []Event
		for i := lo; i > lo-700 && i >= 0; i-- {
			evs = append(evs, ev(i))
		}
		for i, r := range observe(t, e, evs...) {
			if !r.Duplicate {
				t.Fatalf("redelivery of %s counted again", evs[i].ID)
			}
		}
	}
	keys := rdb.Keys(ctx, prefix+":*").Val()
	for _, k := range keys {
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("key %s has no expiry (%v)", k, ttl)
		}
	}
}

// Inspect tells what the counter holds for a group, as the last event saw
// it, and changes nothing.
func TestInspect(t *testing.T) {
	rdb := testRedis(t)
	ctx := context.Background()
	e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
	events := mustRule(t, seenMore(rules.WindowSpec{Threshold: 3, Period: 60_000}, rules.WindowSpec{Threshold: 100, Period: 3_600_000}))
	usersSpec := seenMore(rules.WindowSpec{Threshold: 10, Period: 60_000})
	usersSpec.CountBy = rules.CountUsers
	users := mustRule(t, usersSpec)
	idleSpec := seenMore(rules.WindowSpec{Threshold: 5, Period: 60_000})
	idleSpec.Including = []string{"never"} // not the ring of the rule above
	idle := mustRule(t, idleSpec)
	start := time.Now().Add(-10 * time.Minute)
	var last Result
	for i, u := range []string{"ann", "bob", "ann", "cid"} {
		last = observe(t, e, Event{ID: fmt.Sprint("m", i), ProjectID: project, GroupHash: "g", UserID: u,
			Time: start.Add(time.Duration(i) * time.Second), Rules: []*rules.Rule{events, users}})[0]
	}
	got, now, err := e.Inspect(ctx, project, "g", []*rules.Rule{events, users, idle})
	if err != nil {
		t.Fatal(err)
	}
	if now.Before(start) {
		t.Errorf("Redis' clock %v", now)
	}
	for k := range 2 {
		g, w := got[k], last.Outcomes[k]
		if fmt.Sprint(g.Counts) != fmt.Sprint(w.Counts) || !g.At.Equal(w.At) || !g.Rearm.Equal(w.Rearm) {
			t.Errorf("rule %d: inspect counts %v at %v rearm %v, last event saw %v at %v rearm %v",
				k, g.Counts, g.At, g.Rearm, w.Counts, w.At, w.Rearm)
		}
	}
	if o := got[2]; !o.At.IsZero() || fmt.Sprint(o.Counts) != "[0]" {
		t.Errorf("a rule the group never counted: %+v", o)
	}
	again, _, err := e.Inspect(ctx, project, "g", []*rules.Rule{events})
	if err != nil || fmt.Sprint(again[0].Counts) != fmt.Sprint(got[0].Counts) {
		t.Errorf("a second look: %v, %v", again, err)
	}
	if r := observe(t, e, Event{ID: "m9", ProjectID: project, GroupHash: "g", Time: start.Add(5 * time.Second),
		Rules: []*rules.Rule{events}})[0].Outcomes[0]; r.Counts[0] != 5 {
		t.Errorf("count after inspecting %v, want 5: inspecting changed the state", r.Counts)
	}
}

// With WaitReplicas, a write that no replica acknowledged fails the call,
// so that the batch is held rather than acked on writes a failover could
// lose; the test's Redis has no replica.
func TestWaitReplicasFailsWithoutReplicas(t *testing.T) {
	rdb := testRedis(t)
	e := New(rdb, Options{Prefix: testPrefix(t, rdb), WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 3, Period: 60_000}))
	_, err := e.ObserveBatch(context.Background(), 0, []Event{{ID: "m1", ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}}})
	if err == nil || !strings.Contains(err.Error(), "0 of 1 replicas") {
		t.Errorf("observe without replicas: %v, want an error saying no replica acknowledged", err)
	}
}

// pipelines records the commands of every pipeline a client sends.
type pipelines struct {
	mu   sync.Mutex
	seen [][]string
}

func (p *pipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (p *pipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var names []string
		for _, c := range cmds {
			name := c.Name()
			if name == "set" {
				name += " " + fmt.Sprint(c.Args()[1])
			}
			names = append(names, name)
		}
		p.mu.Lock()
		p.seen = append(p.seen, names)
		p.mu.Unlock()
		return next(ctx, cmds)
	}
}

// WAIT covers what its own connection wrote. A batch tried again after a
// WAIT that failed is a replay that writes nothing (the first try's writes
// are there, made on another connection): its WAIT must still cover them,
// or the ack outruns writes a failover can lose - the chaos run's missed
// firing with KLAXON_REDIS_WAIT_REPLICAS=1. So every WAIT follows a write
// of its own pipeline.
func TestWaitFollowsAWriteOfItsOwn(t *testing.T) {
	rdb := testRedis(t)
	rec := &pipelines{}
	rdb.AddHook(rec)
	prefix := testPrefix(t, rdb)
	e := New(rdb, Options{Prefix: prefix, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 3, Period: 60_000}))
	events := []Event{{ID: "m1", ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}},
		{ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}}}
	for try := range 2 { // the second is the replay of the first
		if _, err := e.ObserveBatch(context.Background(), 42, events); err == nil {
			t.Fatalf("try %d passed WAIT without a replica", try+1)
		}
	}
	waits := 0
	for _, names := range rec.seen {
		i := slices.Index(names, "wait")
		if i < 0 {
			continue
		}
		waits++
		if i == 0 || names[i-1] != "set "+prefix+":wait" {
			t.Errorf("pipeline %v: WAIT without a write of its own just before", names)
		}
	}
	if waits < 2 {
		t.Errorf("%d pipelines with WAIT, want one per try at least", waits)
	}
}

// Two histories of a group that parted (a failover: one write kept by the
// old master, another made on the new one) must not reach one generation:
// the compare-and-set would take a state read on one node for the state of
// the other and write over counts acknowledged there. A generation made of
// the last one and the writing batch's token keeps them apart; a count of
// writes did not. Both paths, the worker's and the script's.
func TestPartedHistoriesHaveDistinctGenerations(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	rule := mustRule(t, seenMore(rules.WindowSpec{Threshold: 100, Period: 60_000}))
	for _, scriptOnly := range []bool{false, true} {
		e := New(rdb, Options{Prefix: testPrefix(t, rdb)})
		e.scriptOnly = scriptOnly
		key := GroupKey(e.prefix, project, "g") + ":s"
		ev := func(id string) []Event {
			return []Event{{ID: id, ProjectID: project, GroupHash: "g", Rules: []*rules.Rule{rule}}}
		}
		if _, err := e.ObserveBatch(ctx, 1001, ev("m0")); err != nil {
			t.Fatal(err)
		}
		before, err := rdb.Get(ctx, key).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		gen := func(token int64, id string) string {
			t.Helper()
			if err := rdb.Set(ctx, key, before, time.Minute).Err(); err != nil { // the history parts here
				t.Fatal(err)
			}
			if _, err := e.ObserveBatch(ctx, token, ev(id)); err != nil {
				t.Fatal(err)
			}
			return rdb.GetRange(ctx, key, genOffset, genOffset+3).Val()
		}
		if a, b := gen(2002, "m1"), gen(3003, "m2"); a == b {
			t.Errorf("script only %v: two writes from one state by two batches both made generation %x", scriptOnly, a)
		}
	}
}
