package evaluator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/hawkdb"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// hawkEvents is a test's events database in FerretDB, written as Hawk's
// grouper and hawk.api write it.
type hawkEvents struct{ db *mongo.Database }

func newHawkEvents(t testing.TB) (*hawkEvents, *hawkdb.Reader) {
	t.Helper()
	uri, db := testenv.HawkDatabase(t)
	// A TTL of a nanosecond: each batch reads marks anew, as a worker does
	// once its 5 s have passed.
	r, err := hawkdb.NewReader(uri, db.Name(), hawkdb.Options{TTL: time.Nanosecond, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return &hawkEvents{db}, r
}

// group inserts a group document as the grouper writes it, with one
// dailyEvents document per day.
func (h *hawkEvents) group(t *testing.T, groupHash string, total int32, days int) {
	t.Helper()
	testenv.HawkGroup(t, h.db, project, groupHash, total, 1700000000, days, nil)
}

// toggle flips a mark as hawk.api's toggleEventMark does: $set to the
// Unix seconds when absent, $unset when present.
func (h *hawkEvents) toggle(t *testing.T, groupHash, mark string, at int32) {
	t.Helper()
	ctx := context.Background()
	c := h.db.Collection("events:" + project)
	var doc struct {
		Marks map[string]any `bson:"marks"`
	}
	if err := c.FindOne(ctx, bson.M{"groupHash": groupHash}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Marks[mark] != nil {
		at = 0
	}
	testenv.HawkMark(t, h.db, project, groupHash, mark, at)
}

type sentJob struct {
	RuleID       string
	Notification notify.Notification
}

// jobsOf are the jobs of msgs, each of one firing.
func jobsOf(t *testing.T, msgs []queue.Message) []sentJob {
	t.Helper()
	var out []sentJob
	for _, m := range msgs {
		j, err := wire.DecodeJob(m.Body)
		if err != nil {
			t.Fatal(err)
		}
		if len(j.Firings) != 1 {
			t.Fatalf("job of %d firings, want one", len(j.Firings))
		}
		out = append(out, sentJob{RuleID: j.Firings[0].RuleID, Notification: *j.Firings[0].Notification})
	}
	return out
}

// regressionSetup is an evaluator with the real counter in Redis and the
// events database in FerretDB, for a project with an ONLY_NEW rule and a
// SEEN_MORE rule that no test reaches.
func regressionSetup(t *testing.T, groups evaluator.Groups) (*evaluator.Evaluator, *fakePublisher) {
	t.Helper()
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: webhook()},
		{ID: "storm", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 1000, ThresholdPeriod: 60_000, Channels: webhook()},
	}})
	pub := &fakePublisher{}
	ev, _ := newEvaluator(snap, counter.New(testenv.Redis(t), counter.Options{Prefix: testenv.KeyPrefix(t)}), pub)
	if groups != nil {
		ev.Groups = groups
	}
	return ev, pub
}

// send hands the evaluator one event as its own batch and returns the jobs
// it published.
func send(t *testing.T, ev *evaluator.Evaluator, pub *fakePublisher, batch int64, group string, isNew bool) []sentJob {
	t.Helper()
	pub.msgs = nil
	b := &queue.Batch{ID: batch, Deliveries: []queue.Delivery{delivery(hawk(project, "TypeError: x is undefined", group, isNew), fmt.Sprintf("m-%d", batch))}}
	if err := ev.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return jobsOf(t, pub.msgs)
}

// A group the tracker marked resolved that comes back fires the ONLY_NEW
// rules once per resolution: its next events are quiet, and a new
// resolution (a new mark) fires again. A reopened group is quiet again.
func TestRegressedGroupFiresOncePerResolution(t *testing.T) {
	h, reader := newHawkEvents(t)
	h.group(t, "g1", 1234, 3)
	ev, pub := regressionSetup(t, reader)

	if jobs := send(t, ev, pub, 1, "g1", false); len(jobs) != 0 {
		t.Fatalf("an unresolved group's repetition: %d jobs, want none", len(jobs))
	}
	h.toggle(t, "g1", "resolved", 1700500000)
	jobs := send(t, ev, pub, 2, "g1", false)
	if len(jobs) != 1 {
		t.Fatalf("first event after the resolution: %d jobs, want 1", len(jobs))
	}
	n := jobs[0].Notification
	if n.Type != notify.TypeRegressed || n.RuleID != "new" || jobs[0].RuleID != "new" ||
		!n.ResolvedAt.Equal(time.Unix(1700500000, 0)) {
		t.Errorf("notification %+v: want type regressed of rule new, resolved at 1700500000", n)
	}
	want := notify.History{TotalCount: 1234, FirstSeen: time.Unix(1700000000, 0).UTC(), DaysRepeated: 3, TopFrame: "app/cart.js:42"}
	if n.History == nil || *n.History != want {
		t.Errorf("history %+v, want %+v", n.History, want)
	}
	first := n.ID
	for i := int64(3); i < 6; i++ {
		if jobs := send(t, ev, pub, i, "g1", false); len(jobs) != 0 {
			t.Fatalf("event %d of the same resolution: %d jobs, want none", i, len(jobs))
		}
	}

	h.toggle(t, "g1", "resolved", 0) // reopened
	if jobs := send(t, ev, pub, 6, "g1", false); len(jobs) != 0 {
		t.Fatalf("a reopened group: %d jobs, want none", len(jobs))
	}
	h.toggle(t, "g1", "resolved", 1700900000) // resolved again
	jobs = send(t, ev, pub, 7, "g1", false)
	if len(jobs) != 1 || jobs[0].Notification.Type != notify.TypeRegressed || jobs[0].Notification.ID == first {
		t.Fatalf("after a second resolution: %+v, want one new regressed firing", jobs)
	}
}

// A group marked ignored never notifies, new or not, whatever its rules.
func TestIgnoredGroupNeverNotifies(t *testing.T) {
	h, reader := newHawkEvents(t)
	h.group(t, "g2", 1, 1)
	h.toggle(t, "g2", "ignored", 1700500000)
	ev, pub := regressionSetup(t, reader)
	if jobs := send(t, ev, pub, 1, "g2", true); len(jobs) != 0 {
		t.Fatalf("a new event of an ignored group: %d jobs, want none", len(jobs))
	}
	h.toggle(t, "g2", "resolved", 1700600000) // ignored and resolved
	if jobs := send(t, ev, pub, 2, "g2", false); len(jobs) != 0 {
		t.Fatalf("a resolved ignored group: %d jobs, want none", len(jobs))
	}
}

// A new group fires with the history, as Hawk's messages show it.
func TestNewGroupCarriesHistory(t *testing.T) {
	h, reader := newHawkEvents(t)
	h.group(t, "g3", 1, 1)
	ev, pub := regressionSetup(t, reader)
	jobs := send(t, ev, pub, 1, "g3", true)
	if len(jobs) != 1 || jobs[0].Notification.Type != notify.TypeNew || jobs[0].Notification.History == nil ||
		jobs[0].Notification.History.TopFrame != "app/cart.js:42" {
		t.Fatalf("jobs %+v: want one new firing with the group's history", jobs)
	}
}

// An events database that does not answer, or fails, costs the bounded
// wait and the extra lines, never the notification.
func TestUnavailableEventsDatabaseStillDelivers(t *testing.T) {
	// 192.0.2.1 (TEST-NET-1) is never routed: every read times out.
	slow, err := hawkdb.NewReader("mongodb://192.0.2.1:27017/", "hawk_events", hawkdb.Options{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slow.Close(context.Background()) })
	for name, groups := range map[string]evaluator.Groups{"slow": slow, "failing": failingGroups{}} {
		t.Run(name, func(t *testing.T) {
			ev, pub := regressionSetup(t, groups)
			jobs := send(t, ev, pub, 1, "g4", true)
			if len(jobs) != 1 || jobs[0].Notification.Type != notify.TypeNew || jobs[0].Notification.History != nil {
				t.Fatalf("jobs %+v: want one new firing without history", jobs)
			}
		})
	}
}

type failingGroups struct{}

func (failingGroups) Group(context.Context, string, string) (hawkdb.Group, error) {
	return hawkdb.Group{}, fmt.Errorf("connection refused")
}

// What reading Hawk's events database adds to a batch on the hot path: a
// batch of 1000 events over 100 groups, all cached (the steady state of
// tools/bench's workloads), against no events database at all.
func BenchmarkHandleWithEventsDB(b *testing.B) {
	snap := compile(b, map[string][]rules.Spec{project: {
		{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: webhook()},
		{ID: "storm", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 1000, ThresholdPeriod: 60_000, Channels: webhook()},
	}})
	batch := &queue.Batch{ID: 1}
	for i := range 1000 {
		batch.Deliveries = append(batch.Deliveries, delivery(hawk(project, "TypeError: x", fmt.Sprintf("g%d", i%100), false), fmt.Sprintf("m%d", i)))
	}
	for _, withDB := range []bool{false, true} {
		b.Run(fmt.Sprintf("eventsDB=%t", withDB), func(b *testing.B) {
			ev, _ := newEvaluator(snap, &fakeCounter{}, &fakePublisher{})
			if withDB {
				ev.Groups = cachedGroups{}
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := ev.Handle(context.Background(), batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch.Deliveries)), "ns/event")
		})
	}
}

// cachedGroups answers as a warm hawkdb.Reader does, without a database.
type cachedGroups struct{}

func (cachedGroups) Group(context.Context, string, string) (hawkdb.Group, error) {
	return hawkdb.Group{TotalCount: 10, Resolved: 1700500000}, nil
}
