package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/snooze"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// notificationsTotal sums klaxon_notifications_total{outcome} over
// workers.
func notificationsTotal(t *testing.T, outcome string, ws ...*worker) int {
	n := 0.0
	for _, w := range ws {
		n += w.metric(t, "klaxon_notifications_total", "outcome", outcome)
	}
	return int(n)
}

// TestSnoozedRuleSendsNothingThenOneSummary: while a rule is snoozed its
// firings are counted and recorded but nothing is sent, by any worker;
// when the snooze ends, one summary lists them all, once. Another rule on
// the same events is not held back.
func TestSnoozedRuleSendsNothingThenOneSummary(t *testing.T) {
	h := newHarness(t)
	muted := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	other := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	project := h.project(muted, other)
	w1, w2 := h.start(), h.start()
	rdb := testenv.Redis(t)
	// A couple of seconds: long enough to hold the firings below, short
	// enough to wait for its end; the test waits on conditions, not time.
	sn, err := snooze.New(rdb, h.prefix).Set(context.Background(),
		snooze.Snooze{ProjectID: project, RuleID: ruleID(muted), Until: time.Now().Add(4 * time.Second), Summary: true}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var msgs []message
	for i := range 3 {
		msgs = append(msgs, event(project, "boom", fmt.Sprint("g", i), true))
	}
	h.publish(msgs...)
	testenv.WaitFor(t, 30*time.Second, "3 firings held back", func() bool { return notificationsTotal(t, "snoozed", w1, w2) == 3 })
	if time.Now().After(sn.Until) {
		t.Fatal("the snooze ended before the firings were held: the machine is too slow for this test")
	}
	bodies := h.webhookBodies(3)
	for _, b := range bodies {
		if b["ruleId"] != ruleID(other) {
			t.Fatalf("sent while snoozed: %v", b)
		}
	}

	// The summary: one digest of the three firings, with the snooze's id.
	bodies = h.webhookBodies(4)
	summary := bodies[3]
	if summary["type"] != "digest" || summary["id"] != "snooze-"+sn.ID() || summary["ruleId"] != ruleID(muted) {
		t.Fatalf("summary %v", summary)
	}
	held, _ := summary["notifications"].([]any)
	if len(held) != 3 {
		t.Fatalf("summary lists %d firings, want 3: %v", len(held), summary)
	}
	for _, n := range held {
		id := n.(map[string]any)["id"].(string)
		if got := rdb.Get(context.Background(), h.prefix+":sent:"+id+":webhook").Val(); got != "snoozed" {
			t.Errorf("firing %s recorded as %q, want snoozed", id, got)
		}
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 4)
	if n := notificationsTotal(t, "snoozed", w1, w2); n != 3 {
		t.Errorf("%d snoozed in the metrics, want 3", n)
	}
}

// TestGroupSnoozeWithoutSummary: a snooze of one group holds back that
// group alone, and one that opted out of the summary sends none; removed,
// the group's next firings go out again.
func TestGroupSnoozeWithoutSummary(t *testing.T) {
	h := newHarness(t)
	r := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	project := h.project(r)
	w := h.start()
	rdb := testenv.Redis(t)
	store := snooze.New(rdb, h.prefix)
	ctx := context.Background()
	if _, err := store.Set(ctx, snooze.Snooze{ProjectID: project, RuleID: ruleID(r), GroupHash: "g1",
		Until: time.Now().Add(time.Hour)}, time.Now()); err != nil {
		t.Fatal(err)
	}
	h.publish(event(project, "boom", "g1", true), event(project, "boom", "g2", true))
	testenv.WaitFor(t, 30*time.Second, "g1 held back", func() bool { return notificationsTotal(t, "snoozed", w) == 1 })
	bodies := h.webhookBodies(1)
	if ev := bodies[0]["event"].(map[string]any); ev["groupHash"] != "g2" {
		t.Fatalf("sent %v, want g2's firing only", bodies[0])
	}
	if ok, err := store.Remove(ctx, project, ruleID(r), "g1"); !ok || err != nil {
		t.Fatalf("remove: %v %v", ok, err)
	}
	// Firings go out again (g1's was held, not lost: it is recorded as
	// snoozed), and no summary follows.
	h.publish(event(project, "boom", "g3", true))
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 2)
}
