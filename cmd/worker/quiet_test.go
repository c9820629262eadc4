package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// quietProject stores a project with rules, quiet from a second ago for
// d, and returns its id and the end of the period.
func (h *harness) quietProject(d time.Duration, rules ...bson.M) (string, time.Time) {
	h.t.Helper()
	from := time.Now().UTC().Add(-time.Second).Truncate(time.Second)
	until := from.Add(d)
	id := bson.NewObjectID()
	list := bson.A{}
	for _, r := range rules {
		list = append(list, r)
	}
	_, err := h.db.Collection("projects").InsertOne(context.Background(), bson.M{
		"_id": id, "name": "test project", "notifications": list,
		"quiet": bson.M{"timezone": "UTC", "hours": bson.A{bson.M{
			"days": bson.A{strings.ToLower(from.Weekday().String()[:3])},
			"from": from.Format("15:04:05"), "to": until.Format("15:04:05")}}},
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return id.Hex(), until
}

// TestQuietHoursHoldAStormThenOneRecapPerDestination: during a project's
// quiet hours a storm's firings are counted and held by every worker, a
// critical rule's go out at once, and when the period ends each
// destination gets one recap of what it held: the webhook both rules'
// six firings, Slack its rule's three, with the groups still above the
// threshold. The period is a few seconds of today, in seconds: the test
// waits on conditions, not on time.
func TestQuietHoursHoldAStormThenOneRecapPerDestination(t *testing.T) {
	h := newHarness(t)
	onlyNew := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	storm := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 1, "thresholdPeriod": 60000, "channels": bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": h.webhook.URL, "minPeriod": 0},
		"slack":   bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0},
	}})
	critical := rule(bson.M{"whatToReceive": "ONLY_NEW", "critical": true, "channels": h.webhookOnly()})
	project, until := h.quietProject(14*time.Second, onlyNew, storm, critical)
	w1, w2 := h.start(), h.start()
	var msgs []message
	for i := range 3 {
		msgs = append(msgs, event(project, "Database timeout", fmt.Sprint("g", i), true))
	}
	h.publish(msgs...)
	// 6 firings on the webhook, 3 on Slack.
	testenv.WaitFor(t, 30*time.Second, "9 firings held", func() bool { return notificationsTotal(t, "quiet", w1, w2) == 9 })
	if time.Now().After(until) {
		t.Fatal("the quiet period ended before the firings were held: the machine is too slow for this test")
	}
	for _, b := range h.webhookBodies(3) {
		if b["ruleId"] != ruleID(critical) {
			t.Fatalf("sent while quiet: %v", b)
		}
	}
	if n := len(h.slack.Requests()); n != 0 {
		t.Fatalf("%d Slack messages while quiet", n)
	}

	// The recaps: one per destination, once, whichever worker sends it.
	recap := h.webhookBodies(4)[3]
	q, _ := recap["quiet"].(map[string]any)
	held, _ := recap["notifications"].([]any)
	if recap["type"] != "digest" || !strings.HasPrefix(fmt.Sprint(recap["id"]), "quiet-") || recap["ruleId"] != "" ||
		q == nil || q["firings"] != 6.0 || len(held) != 6 || q["until"] != until.Format(time.RFC3339) {
		t.Fatalf("webhook recap %v", recap)
	}
	rulesHeld, _ := q["rules"].([]any)
	if len(rulesHeld) != 2 || q["stillAbove"] != 3.0 {
		t.Errorf("webhook recap's rules %v, still above %v; want both rules, storm's 3 groups above", rulesHeld, q["stillAbove"])
	}
	slack, err := h.slack.WaitFor(1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := "While quiet: 1 rule fired 3 times; 3 groups still above threshold"; slack[0].Text != want {
		t.Errorf("Slack recap %q, want %q", slack[0].Text, want)
	}
	rdb := testenv.Redis(t)
	for _, n := range held {
		nid := n.(map[string]any)["id"].(string)
		if got := rdb.Get(context.Background(), h.prefix+":sent:"+nid+":webhook").Val(); got != "quiet" {
			t.Errorf("firing %s recorded as %q, want quiet", nid, got)
		}
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) + len(h.slack.Requests()) }, 5)
	if n := notificationsTotal(t, "quiet", w1, w2); n != 9 {
		t.Errorf("%d quiet in the metrics, want 9", n)
	}
}

// TestQuietRecapSurvivesAKilledWorker: the worker that held a quiet
// period's firings, and scheduled its recap, is killed (SIGKILL) before
// the period ends. Another worker sends the recap when it ends, once,
// listing every firing; the storm's messages delivered again (their
// first worker never acked them all) send nothing more.
func TestQuietRecapSurvivesAKilledWorker(t *testing.T) {
	h := newHarness(t)
	buildBinary(t) // now, not within the quiet period: a build takes seconds
	r := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	project, until := h.quietProject(15*time.Second, r)
	w, cmd, exited, _ := h.startBinary()
	var msgs []message
	for i := range 3 {
		m := event(project, "Database timeout", fmt.Sprint("g", i), true)
		m.ID = fmt.Sprint("m", i)
		msgs = append(msgs, m)
	}
	h.publish(msgs...)
	w.waitMetric(t, 30*time.Second, "3 firings held", func(v float64) bool { return v == 3 },
		"klaxon_notifications_total", "outcome", "quiet")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	if time.Now().After(until) {
		t.Fatal("the quiet period ended before the worker was killed: the machine is too slow for this test")
	}
	h.start()
	h.publish(msgs...)
	recap := h.webhookBodies(1)[0]
	if held, _ := recap["notifications"].([]any); !strings.HasPrefix(fmt.Sprint(recap["id"]), "quiet-") || len(held) != 3 {
		t.Fatalf("recap %v, want the quiet period's of 3 firings", recap)
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 1)
}
