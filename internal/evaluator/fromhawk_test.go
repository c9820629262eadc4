package evaluator_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/hawkdb"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// plain is a project whose rules count events, not users.
const plain = "5e3eef0679fa3700a0198a4b"

// askedRepetitions counts the queries an evaluator makes of Repetitions.
type askedRepetitions struct {
	reps evaluator.Repetitions
	err  error

	mu  sync.Mutex
	ids map[string][][]string // by project, one entry a query
}

func (a *askedRepetitions) Repetitions(ctx context.Context, projectID string, ids []string) (map[string]hawkdb.Repetition, error) {
	a.mu.Lock()
	if a.ids == nil {
		a.ids = map[string][][]string{}
	}
	a.ids[projectID] = append(a.ids[projectID], slices.Clone(ids))
	a.mu.Unlock()
	if a.err != nil {
		return nil, a.err
	}
	return a.reps.Repetitions(ctx, projectID, ids)
}

func withRepetition(project, group string, isNew bool, rep string, extra string) string {
	return fmt.Sprintf(`{"projectId":%q,"event":{"title":"TypeError: x is undefined","groupHash":%q,"isNew":%t,"repetitionId":%q%s}}`,
		project, group, isNew, rep, extra)
}

func usersSnapshot(t *testing.T) *evaluator.Evaluator {
	t.Helper()
	snap := compile(t, map[string][]rules.Spec{
		project: {
			{ID: "users", IsEnabled: true, WhatToReceive: rules.SeenMore, CountBy: rules.CountUsers, Threshold: 50, ThresholdPeriod: 60_000, Channels: webhook()},
			{ID: "events", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 50, ThresholdPeriod: 60_000, Channels: webhook()},
		},
		plain: {{ID: "events", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 50, ThresholdPeriod: 60_000, Channels: webhook()}},
	})
	e, _ := newEvaluator(snap, &fakeCounter{record: true}, &fakePublisher{})
	return e
}

// Stock Hawk's events say neither when they happened nor whose they are;
// Hawk's documents do. An isNew event takes both from its group's document
// (read for the batch anyway); for the project with a countBy users rule,
// an event without a user takes its repetition's, and its time, in one
// query for the batch. What an event says itself is kept; a repetition
// of another group, an id that is no ObjectId, and the events of a project
// that counts no users are left as they came. Only the events still
// without a user starve the users rule.
func TestEventsTakeTheirTimeAndUserFromHawksDocuments(t *testing.T) {
	h, reader := newHawkEvents(t)
	const t0 = 1700000000
	testenv.HawkGroup(t, h.db, project, "g", 3, t0, 1, nil)
	testenv.HawkGroupUser(t, h.db, project, "g", "alice")
	bob := testenv.HawkRepetition(t, h.db, project, "g", t0+10, testenv.HawkUserDelta("bob"))
	same := testenv.HawkRepetition(t, h.db, project, "g", t0+20, `{"context":{"b":[2]}}`)
	own := testenv.HawkRepetition(t, h.db, project, "g", t0+30, testenv.HawkUserDelta("carol"))
	otherGroup := testenv.HawkRepetition(t, h.db, project, "h", t0+40, testenv.HawkUserDelta("dave"))
	testenv.HawkGroup(t, h.db, plain, "p", 2, t0, 1, nil)
	plainRep := testenv.HawkRepetition(t, h.db, plain, "p", t0+50, testenv.HawkUserDelta("erin"))

	e := usersSnapshot(t)
	e.Groups = reader
	asked := &askedRepetitions{reps: reader}
	e.Repetitions = asked
	seen := starvedSeen{}
	e.Starved = seen
	b := &queue.Batch{Deliveries: []queue.Delivery{
		delivery(hawk(project, "TypeError: x is undefined", "g", true), "new"),
		delivery(withRepetition(project, "g", false, bob, ""), ""),
		delivery(withRepetition(project, "g", false, same, ""), ""),
		delivery(withRepetition(project, "g", false, own, `,"timestamp":1700000031.5,"user":{"id":"zed"}`), ""),
		delivery(withRepetition(project, "g", false, otherGroup, ""), ""),
		delivery(withRepetition(project, "g", false, "r9", ""), ""),
		delivery(withRepetition(plain, "p", false, plainRep, ""), ""),
	}}
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	type counted struct {
		at   time.Time
		user string
	}
	got := map[string]counted{}
	for _, ev := range e.Counter.(*fakeCounter).calls[0] {
		got[ev.ID] = counted{ev.Time, ev.UserID}
	}
	at := func(s float64) time.Time { return time.UnixMilli(int64(s * 1000)) }
	want := map[string]counted{
		"id:new":            {at(t0), "alice"},
		"rep:" + bob:        {at(t0 + 10), "bob"},
		"rep:" + same:       {at(t0 + 20), "alice"},
		"rep:" + own:        {at(1700000031.5), "zed"},
		"rep:" + otherGroup: {},
		"rep:r9":            {},
		"rep:" + plainRep:   {},
	}
	if len(got) != len(want) {
		t.Fatalf("counted %v, want %v", got, want)
	}
	for id, w := range want {
		if g := got[id]; !g.at.Equal(w.at) || g.user != w.user {
			t.Errorf("%s counted at %v by %q, want at %v by %q", id, g.at, g.user, w.at, w.user)
		}
	}
	wantAsked := map[string][][]string{project: {{bob, same, otherGroup, "r9"}}}
	if !maps.EqualFunc(asked.ids, wantAsked, func(a, b [][]string) bool {
		return slices.EqualFunc(a, b, slices.Equal)
	}) {
		t.Errorf("repetitions asked for %v, want %v: one query, of the users project's events without a user", asked.ids, wantAsked)
	}
	if want := (starvedSeen{project + "/users/no_user": 2}); !maps.Equal(seen, want) {
		t.Errorf("told of %v, want %v", seen, want)
	}

	// Tried again (a batch whose reply was lost), it counts at the same
	// times: they are the database's.
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	first, again := e.Counter.(*fakeCounter).calls[0], e.Counter.(*fakeCounter).calls[1]
	for i := range first {
		if !again[i].Time.Equal(first[i].Time) || again[i].UserID != first[i].UserID {
			t.Errorf("%s tried again: at %v by %q, first at %v by %q", first[i].ID, again[i].Time, again[i].UserID, first[i].Time, first[i].UserID)
		}
	}
}

// Where Hawk's database fails, the events go on as they came, and the
// batch is counted as without it.
func TestRepetitionsThatFailLeaveEventsAsTheyCame(t *testing.T) {
	e := usersSnapshot(t)
	e.Repetitions = &askedRepetitions{err: errors.New("events database down")}
	seen := starvedSeen{}
	e.Starved = seen
	rep := "65f0a1b2c3d4e5f6a7b8c9d0"
	b := &queue.Batch{Deliveries: []queue.Delivery{delivery(withRepetition(project, "g", false, rep, ""), "")}}
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	evs := e.Counter.(*fakeCounter).calls[0]
	if len(evs) != 1 || !evs[0].Time.IsZero() || evs[0].UserID != "" {
		t.Errorf("counted %+v, want the event as it came", evs)
	}
	if want := (starvedSeen{project + "/users/no_user": 1}); !maps.Equal(seen, want) {
		t.Errorf("told of %v, want %v", seen, want)
	}
}

// What reading the repetitions costs the evaluator: 1,000 events of one
// project with a countBy users rule, stock Hawk's (no user, no time), over
// 20 groups, in batches of n, with their 1,000 repetitions in the embedded
// FerretDB; "none" is the same without Repetitions.
//
//	go test -run '^$' -bench HandleReadsRepetitions -benchtime 5x ./internal/evaluator/
func BenchmarkHandleReadsRepetitions(b *testing.B) {
	h, reader := newHawkEvents(b)
	snap := compile(b, map[string][]rules.Spec{project: {
		{ID: "users", IsEnabled: true, WhatToReceive: rules.SeenMore, CountBy: rules.CountUsers, Threshold: 50, ThresholdPeriod: 60_000, Channels: webhook()},
	}})
	const events = 1000
	var deliveries []queue.Delivery
	for i := range events {
		group := fmt.Sprintf("g%d", i%20)
		rep := testenv.HawkRepetition(b, h.db, project, group, int32(1700000000+i), testenv.HawkUserDelta(fmt.Sprintf("user-%d", i)))
		deliveries = append(deliveries, queue.Delivery{Body: []byte(withRepetition(project, group, false, rep, "")), DeliveryTag: uint64(i + 1)})
	}
	for _, bc := range []struct {
		name  string
		batch int
		reps  bool
	}{{"none", 250, false}, {"batch=64", 64, true}, {"batch=250", 250, true}, {"batch=1000", 1000, true}} {
		b.Run(bc.name, func(b *testing.B) {
			c := &fakeCounter{}
			e, _ := newEvaluator(snap, c, &fakePublisher{})
			asked := &askedRepetitions{reps: reader}
			if bc.reps {
				e.Repetitions = asked
			}
			batches := 0
			for b.Loop() {
				for i := 0; i < events; i += bc.batch {
					batch := &queue.Batch{ID: int64(i), Deliveries: deliveries[i:min(i+bc.batch, events)]}
					if err := e.Handle(context.Background(), batch); err != nil {
						b.Fatal(err)
					}
					batches++
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*events), "µs/event")
			b.ReportMetric(float64(len(asked.ids[project]))/float64(batches), "queries/batch")
		})
	}
}
