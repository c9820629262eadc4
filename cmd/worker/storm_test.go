package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/storm"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// burst is n events of a group, one every 100 ms from base.
func burst(project, title, group string, base time.Time, n int) []message {
	var msgs []message
	for i := range n {
		ts := base.Add(time.Duration(i) * 100 * time.Millisecond)
		msgs = append(msgs, event(project, title, group, false, fmt.Sprintf(`"timestamp":%.3f`, float64(ts.UnixMilli())/1000)))
	}
	return msgs
}

// tenSecondsAgo is a whole 100 ms (a bucket's start for 1 s windows) ten
// seconds before now: a storm made of events stamped from it is over, and
// its length and events exact, at the worker's first look.
func tenSecondsAgo() time.Time {
	return time.Now().Add(-10 * time.Second).Truncate(100 * time.Millisecond)
}

// warmUp has the worker's consumer take 64 events of a project without
// rules, so that its prefetch, which starts at 1 and doubles, takes a
// storm whole: a storm over at the worker's first look, split over two
// batches, could be swept over before its last events are counted.
func (h *harness) warmUp() {
	h.t.Helper()
	var msgs []message
	for i := range 64 {
		msgs = append(msgs, event("000000000000000000000000", "warm-up", fmt.Sprint("warm-", i), false))
	}
	h.publish(msgs...)
	testenv.WaitFor(h.t, 30*time.Second, "the warm-up events taken", func() bool {
		ready, unacked, ok := queueMessages(h.t, h.queue)
		return ok && ready+unacked == 0 || !ok && readyMessages(h.t, h.amqpURL, h.queue) == 0
	})
}

// seenMore is a rule of 5 events in 1 s, for titles with word.
func seenMore(word string, fields bson.M) bson.M {
	r := rule(bson.M{"whatToReceive": "SEEN_MORE", "including": bson.A{word}, "threshold": 5, "thresholdPeriod": 1000})
	for k, v := range fields {
		r[k] = v
	}
	return r
}

// twoStorms publishes a storm of 6 "DatabaseError" events and one of 6
// "CacheError" events, each over at the worker's first look, and waits
// for the two firings and the one storm-over message it wants. It returns
// the webhook bodies and when the storms began.
func (h *harness) twoStorms(project string) ([]map[string]any, time.Time) {
	h.warmUp()
	base := tenSecondsAgo()
	h.publish(append(burst(project, "DatabaseError", "db", base, 6), burst(project, "CacheError", "cache", base, 6)...)...)
	bodies := h.webhookBodies(3)
	waitQuiet(h.t, func() int { return len(h.webhook.Requests()) }, 3)
	return bodies, base
}

func stormOverBodies(bodies []map[string]any) []map[string]any {
	var out []map[string]any
	for _, b := range bodies {
		if b["type"] == notify.TypeStormOver {
			out = append(out, b)
		}
	}
	return out
}

func TestStormOverOnceOnEveryChannel(t *testing.T) {
	h := newHarness(t)
	channels := h.allChannels()
	channels["loop"] = bson.M{"isEnabled": true, "endpoint": h.loop.URL, "minPeriod": 0}
	stormy := seenMore("database", bson.M{"stormOver": true, "channels": channels})
	plain := seenMore("cache", bson.M{"channels": h.webhookOnly()})
	project := h.project(stormy, plain)
	h.start()
	// Two firings and one storm over on the webhook; one of each elsewhere.
	bodies, base := h.twoStorms(project)
	over := stormOverBodies(bodies)
	if len(over) != 1 {
		t.Fatalf("%d storm-over bodies, want 1: %v", len(over), bodies)
	}
	var firing map[string]any
	for _, b := range bodies {
		if b["type"] == "threshold" && b["ruleId"] == stormy["_id"].(bson.ObjectID).Hex() {
			firing = b
		}
	}
	o := over[0]
	st, _ := o["storm"].(map[string]any)
	overID := storm.OverID(firing["id"].(string))
	// The 5th event fired at +400 ms; the window fell below 5 events when
	// its second bucket left it, at +1,200 ms: 800 ms, 6 events.
	if o["version"] != "4" || o["id"] != overID || o["ruleId"] != firing["ruleId"] || st == nil ||
		st["firingId"] != firing["id"] || st["events"] != 6.0 || st["duration"] != 800.0 || st["exact"] != true ||
		o["count"] != 6.0 || o["threshold"] != 5.0 || o["period"] != 1000.0 {
		t.Fatalf("storm-over body %v (firing %v)", o, firing["id"])
	}
	if q, _ := time.Parse(time.RFC3339Nano, st["quietSince"].(string)); !q.Equal(base.Add(1200 * time.Millisecond)) {
		t.Errorf("quietSince %v, want %v", st["quietSince"], base.Add(1200*time.Millisecond))
	}
	for _, r := range h.webhook.Requests() {
		if strings.Contains(string(r.Body), notify.TypeStormOver) && r.Header.Get("Idempotency-Key") != overID {
			t.Errorf("Idempotency-Key %q, want %s", r.Header.Get("Idempotency-Key"), overID)
		}
	}

	slackReqs, err := h.slack.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := countContaining(slackTexts(slackReqs), "storm over: 6 events in 0.8 seconds"); got != 1 {
		t.Errorf("%d Slack storm-over messages, want 1: %q", got, slackTexts(slackReqs))
	}
	loopReqs, err := h.loop.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var loopTexts []string
	for _, r := range loopReqs {
		loopTexts = append(loopTexts, r.Text)
	}
	if got := countContaining(loopTexts, "Notification id "+overID); got != 1 {
		t.Errorf("%d Loop messages carry %s, want 1: %q", got, overID, loopTexts)
	}
	if got := countContaining(loopTexts, "Closes notification "+firing["id"].(string)); got != 1 {
		t.Errorf("%d Loop messages name the firing they close, want 1: %q", got, loopTexts)
	}
	tgReqs, err := h.telegram.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var tgTexts []string
	for _, r := range tgReqs {
		tgTexts = append(tgTexts, r.Text)
	}
	if got := countContaining(tgTexts, "Storm over: 6 events in 0.8 seconds, then below 5 for 1 second"); got != 1 {
		t.Errorf("%d Telegram storm-over messages, want 1: %q", got, tgTexts)
	}
	mails, err := h.smtp.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ids := 0
	for _, m := range mails {
		msg, err := m.Parse()
		if err != nil {
			t.Fatal(err)
		}
		if msg.Header.Get("X-Klaxon-Notification-Id") == overID {
			ids++
			if subject, _ := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject")); !strings.Contains(subject, "storm over") {
				t.Errorf("storm-over email subject %q", subject)
			}
		}
	}
	if ids != 1 {
		t.Errorf("%d storm-over emails, want 1", ids)
	}
	waitQuiet(t, func() int {
		return len(h.slack.Requests()) + len(h.telegram.Requests()) + len(h.smtp.Messages()) + len(h.loop.Requests())
	}, 8)
}

func TestStormThatGoesOnIsOneStorm(t *testing.T) {
	h := newHarness(t)
	r := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 5, "thresholdPeriod": 3000, "stormOver": true,
		"channels": h.webhookOnly()})
	project := h.project(r)
	h.start()

	five := func() []message {
		var msgs []message
		for range 5 {
			msgs = append(msgs, event(project, "Timeout", "back", false))
		}
		return msgs
	}
	h.publish(five()...)
	first := h.webhookBodies(1)[0]
	// More within the period (the window cannot fall below before the
	// first five leave it, 3 s on): the same storm, which ends once,
	// with every event. (history_test.go has storms that fall below and
	// come back, at exact times.)
	h.publish(five()...)
	bodies := h.webhookBodies(2)
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 2)
	over := stormOverBodies(bodies)
	if len(over) != 1 || bodies[1]["type"] != notify.TypeStormOver {
		t.Fatalf("bodies %v: want the storm-over message last, once", bodies)
	}
	st := over[0]["storm"].(map[string]any)
	if st["firingId"] != first["id"] || st["events"] != 10.0 || st["exact"] != true {
		t.Fatalf("storm %v: want 10 events, closing firing %v", st, first["id"])
	}
}

func TestStormOverSettingTurnsItOnForEveryRule(t *testing.T) {
	h := newHarness(t)
	h.env["KLAXON_STORM_OVER"] = "true"
	unsaid := seenMore("database", bson.M{"channels": h.webhookOnly()})
	optedOut := seenMore("cache", bson.M{"stormOver": false, "channels": h.webhookOnly()})
	project := h.project(unsaid, optedOut)
	h.start()
	bodies, _ := h.twoStorms(project)
	over := stormOverBodies(bodies)
	if len(over) != 1 || over[0]["ruleId"] != unsaid["_id"].(bson.ObjectID).Hex() {
		t.Fatalf("storm-over bodies %v: want one, for the rule that did not say", over)
	}
}

// killedAfterPublishing publishes, then dies before it can record that it
// did: the next worker publishes the same jobs again.
type killedAfterPublishing struct {
	pub   *queue.Publisher
	calls chan struct{}
}

func (k *killedAfterPublishing) Publish(ctx context.Context, msgs ...queue.Message) error {
	if err := k.pub.Publish(ctx, msgs...); err != nil {
		return err
	}
	k.calls <- struct{}{}
	return errors.New("killed")
}

func TestWorkerKilledMidCheckStillSendsOneStormOver(t *testing.T) {
	h := newHarness(t)
	channels := bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": h.webhook.URL, "minPeriod": 0},
		"slack":   bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0},
	}
	doc := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 5, "thresholdPeriod": 1000, "stormOver": true, "channels": channels})
	project := h.project(doc)
	on := true
	spec := rules.Spec{ID: doc["_id"].(bson.ObjectID).Hex(), IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 5,
		ThresholdPeriod: 1000, StormOver: &on, Channels: map[string]rules.ChannelSpec{
			"webhook": {IsEnabled: true, Endpoint: h.webhook.URL}, "slack": {IsEnabled: true, Endpoint: h.slack.URL}}}
	r, _, err := rules.Compile(project, spec)
	if err != nil {
		t.Fatal(err)
	}

	// A worker counts a storm, starts it, decides it is over and publishes
	// its jobs, and is killed before it records that it did.
	ctx := context.Background()
	rdb := testenv.Redis(t)
	engine := counter.New(rdb, counter.Options{Prefix: h.prefix})
	base := tenSecondsAgo()
	var events []counter.Event
	for i := range 6 {
		events = append(events, counter.Event{ProjectID: project, GroupHash: "g", Time: base.Add(time.Duration(i) * 100 * time.Millisecond), Rules: []*rules.Rule{r}})
	}
	res, err := engine.ObserveBatch(ctx, 1, events)
	if err != nil {
		t.Fatal(err)
	}
	o := res[4].Outcomes[0]
	if !o.Fired {
		t.Fatal("the 5th event did not fire")
	}
	pub, err := queue.NewPublisher(queue.PublisherConfig{URL: h.amqpURL, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Declare(ctx, wire.DeliveryQueue(h.prefix), nil); err != nil {
		t.Fatal(err)
	}
	killed := &killedAfterPublishing{pub: pub, calls: make(chan struct{}, 1)}
	dying := storm.New(storm.Config{Redis: rdb, Prefix: h.prefix, Rings: engine, Rules: staticRules{rules.NewMatcher([]*rules.Rule{r})},
		Publisher: killed, DeliveryQueue: wire.DeliveryQueue(h.prefix), Lease: 500 * time.Millisecond,
		Metrics: metrics.New(prometheus.NewRegistry())})
	n := notify.Notification{ID: o.ID, Type: notify.TypeThreshold, ProjectID: project, RuleID: r.ID,
		Event: notify.Event{Title: "DatabaseError", GroupHash: "g"}, Count: o.Counts[0], FiredAt: o.At}
	if err := dying.Start(ctx, r, 0, &n); err != nil {
		t.Fatal(err)
	}
	for len(killed.calls) == 0 {
		_ = dying.Sweep(ctx)
	}

	// A worker takes the storm over when the lease ends and publishes the
	// same jobs; the deliverer sends each once.
	h.start()
	reqs, err := h.webhook.WaitFor(1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the storm to be closed", func() bool {
		return rdb.ZCard(ctx, h.prefix+":{storms}:due").Val() == 0
	})
	waitQuiet(t, func() int { return len(h.webhook.Requests()) + len(h.slack.Requests()) }, 2)
	if key := reqs[0].Header.Get("Idempotency-Key"); key != storm.OverID(o.ID) {
		t.Fatalf("webhook %s, want the storm-over message %s", key, storm.OverID(o.ID))
	}
	if h.logCount("storm over") != 1 {
		t.Errorf("%d \"storm over\" log lines, want 1", h.logCount("storm over"))
	}
}

type staticRules struct{ m *rules.Matcher }

func (s staticRules) Matcher(string) *rules.Matcher { return s.m }
func (s staticRules) Ready() bool                   { return true }
