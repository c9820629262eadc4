package main

import (
	"fmt"
	"mime"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// A new-error rule notifies on all five channels once, whatever is
// duplicated or redelivered, and every channel carries the same id.
func TestNewErrorNotifiesEveryChannelOnce(t *testing.T) {
	h := newHarness(t)
	channels := h.allChannels()
	channels["loop"] = bson.M{"isEnabled": true, "endpoint": h.loop.URL, "minPeriod": 0}
	r := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": channels})
	project := h.project(r)
	h.start()

	title := `DB <down> & "*bold*" _x_ [y]`
	first := event(project, title, "grp-a", true)
	first.ID = "msg-1"
	again := first // the same message published twice
	other := event(project, title, "grp-a", true, `"repetitionId":"r2"`)
	h.publish(first, again, other)
	if _, err := h.webhook.WaitFor(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := h.smtp.WaitFor(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// The same message again once it was notified: a redelivery after a
	// crash. Its firing is replayed, and every channel must skip it.
	h.publish(again)
	// A later group's notification proves the duplicates were handled.
	h.publish(event(project, "second", "grp-b", true))

	bodies := h.webhookBodies(2)
	slackReqs, err := h.slack.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tgReqs, err := h.telegram.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mails, err := h.smtp.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	loopReqs, err := h.loop.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var a map[string]any
	for _, b := range bodies {
		if b["event"].(map[string]any)["groupHash"] == "grp-a" {
			a = b
		}
	}
	if a == nil {
		t.Fatalf("no webhook for grp-a in %v", bodies)
	}
	id := a["id"].(string)
	if a["type"] != "new" || a["projectId"] != project || a["ruleId"] != r["_id"].(bson.ObjectID).Hex() || a["count"] != 1.0 {
		t.Errorf("webhook body %v", a)
	}
	if ev := a["event"].(map[string]any); ev["title"] != title || ev["repetitionId"] != nil {
		t.Errorf("webhook event %v", ev)
	}
	// What people act on: the project by name (from the rules snapshot),
	// the rule in words, and Hawk's page: without an events database the
	// event's id is unknown, and the link is the project's page.
	eventURL := "https://garage.hawk.so/project/" + project
	if said := h.logs.logLines(eventIDUnknown); len(said) != 1 || said[0]["fallback"] != "https://garage.hawk.so/project/{projectId}" {
		t.Errorf("start-up lines %v: want one saying links are the fallback's", said)
	}
	if a["version"] != "4" || a["projectName"] != "test project" || a["ruleDescription"] != "new errors" ||
		a["event"].(map[string]any)["url"] != eventURL {
		t.Errorf("webhook body %v: want version 3, the project's name, the rule in words and the event's URL", a)
	}
	if _, err := time.Parse(time.RFC3339, a["firedAt"].(string)); err != nil {
		t.Errorf("firedAt: %v", err)
	}
	for _, req := range h.webhook.Requests() {
		if req.Header.Get("Content-Type") != "application/json" || req.Header.Get("Idempotency-Key") == "" {
			t.Errorf("webhook headers %v", req.Header)
		}
	}

	if got := countContaining(slackTexts(slackReqs), "DB &lt;down&gt; &amp;"); got != 1 {
		t.Errorf("%d Slack messages for grp-a's escaped title, want 1: %q", got, slackTexts(slackReqs))
	}
	var loopTexts []string
	for _, r := range loopReqs {
		if r.Username != "Hawk" {
			t.Errorf("loop username %q", r.Username)
		}
		loopTexts = append(loopTexts, r.Text)
	}
	if got := countContaining(loopTexts, "`"+title+"`"); got != 1 {
		t.Errorf("%d Loop messages with grp-a's title in a code span, want 1: %q", got, loopTexts)
	}
	// Both groups' messages link to the project's page.
	if got := countContaining(loopTexts, "[View event]("+eventURL+")"); got != 2 {
		t.Errorf("%d Loop messages link to %s, want 2: %q", got, eventURL, loopTexts)
	}
	if got := countContaining(loopTexts, "Project test project ("+project+")"); got != 2 {
		t.Errorf("%d Loop messages name the project, want 2: %q", got, loopTexts)
	}
	if got := countContaining(loopTexts, "Notification id "+id); got != 1 {
		t.Errorf("%d Loop messages carry the webhook's id %s, want 1: %q", got, id, loopTexts)
	}
	var tgTexts []string
	for _, r := range tgReqs {
		if r.ChatID != "-1001234" {
			t.Errorf("telegram chat_id %q", r.ChatID)
		}
		tgTexts = append(tgTexts, r.Text)
	}
	if got := countContaining(tgTexts, "DB &lt;down&gt; &amp;amp;"); got != 0 {
		t.Errorf("Telegram title escaped twice: %q", tgTexts)
	}
	if got := countContaining(tgTexts, "DB &lt;down&gt; &amp;"); got != 1 {
		t.Errorf("%d Telegram messages for grp-a's escaped title, want 1: %q", got, tgTexts)
	}
	found := false
	for _, m := range mails {
		msg, err := m.Parse()
		if err != nil {
			t.Fatal(err)
		}
		subject, _ := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
		if !strings.Contains(subject, title) {
			continue
		}
		found = true
		if !strings.HasPrefix(subject, "[Klaxon] [test project] ") {
			t.Errorf("email subject %q does not name the project", subject)
		}
		if got := msg.Header.Get("X-Klaxon-Notification-Id"); got != id {
			t.Errorf("email notification id %q, webhook's %q", got, id)
		}
		if fmt.Sprint(m.To) != "[ops@example.com dev@example.com]" {
			t.Errorf("email to %v", m.To)
		}
		parts, err := m.Parts()
		if err != nil {
			t.Fatal(err)
		}
		if parts["text/plain"] == "" || parts["text/html"] == "" {
			t.Errorf("email parts %v, want text and HTML", keys(parts))
		}
	}
	if !found {
		t.Errorf("no email with the title in its subject")
	}

	// Exactly two of each: grp-a once, grp-b once.
	waitQuiet(t, func() int {
		return len(h.webhook.Requests()) + len(h.slack.Requests()) + len(h.telegram.Requests()) + len(h.smtp.Messages()) +
			len(h.loop.Requests())
	}, 10)
	if logs := h.logs.String(); strings.Contains(logs, telegramToken) || strings.Contains(logs, h.webhook.Path) ||
		strings.Contains(logs, h.slack.Token) || strings.Contains(logs, h.loop.Token) {
		t.Error("a secret (Telegram token, webhook, Slack or Loop URL) is in the logs")
	}
}

// DESIGN.md's fixed-window trap fires, once, through the whole worker.
func TestFixedWindowTrapFiresOnce(t *testing.T) {
	h := newHarness(t)
	project := h.project(rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 1000, "thresholdPeriod": 120000, "channels": h.webhookOnly()}))
	h.start()
	start := float64(time.Now().Add(-time.Hour).Unix())
	var msgs []message
	for m, n := range []int{1, 900, 900} {
		for i := range n {
			ts := start + float64(m)*60 + float64(i)*60/float64(n)
			msgs = append(msgs, event(project, "Timeout", "trap", false, fmt.Sprintf(`"timestamp":%f`, ts)))
		}
	}
	h.publish(msgs...)
	b := h.webhookBodies(1)[0]
	if b["type"] != "threshold" || b["count"] != 1000.0 || b["threshold"] != 1000.0 || b["period"] != 120000.0 {
		t.Errorf("threshold body %v", b)
	}
	ws := b["windows"].([]any)
	if len(ws) != 1 || ws[0].(map[string]any)["resetAt"] == nil {
		t.Errorf("windows %v", ws)
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 1)
}

// Title filters, disabled rules and disabled channels.
func TestFiltersAndDisabled(t *testing.T) {
	h := newHarness(t)
	db := rule(bson.M{"whatToReceive": "ONLY_NEW", "including": bson.A{"Database"}, "channels": h.webhookOnly()})
	notTest := rule(bson.M{"whatToReceive": "ONLY_NEW", "excluding": bson.A{"TEST"}, "channels": h.webhookOnly()})
	off := rule(bson.M{"whatToReceive": "ONLY_NEW", "isEnabled": false, "channels": h.webhookOnly()})
	missing := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	delete(missing, "isEnabled")
	slackOnly := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"webhook": bson.M{"isEnabled": false, "endpoint": h.webhook.URL},
		"slack":   bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0},
	}})
	project := h.project(db, notTest, off, missing, slackOnly)
	h.start()
	h.publish(
		event(project, "database is down", "g1", true),   // db, notTest, slackOnly
		event(project, "unit test failed", "g2", true),   // slackOnly
		event(project, "database again", "g3", false),    // none: not new
		event(project, "Database in a Test", "g4", true), // db, slackOnly
	)
	bodies := h.webhookBodies(2) // db and notTest on g1 in one message, db on g4
	got := map[string]bool{}
	for k := range firingsOf(t, bodies) {
		got[k] = true
	}
	id := func(r bson.M) string { return r["_id"].(bson.ObjectID).Hex() }
	for _, want := range []string{id(db) + "/g1", id(notTest) + "/g1", id(db) + "/g4"} {
		if !got[want] {
			t.Errorf("no webhook for %s in %v", want, got)
		}
	}
	if _, err := h.slack.WaitFor(3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) + len(h.slack.Requests()) }, 5)
}

// Poison messages land in <queue>.dead with the reason, and the worker
// carries on.
func TestPoisonMessagesDeadLettered(t *testing.T) {
	h := newHarness(t)
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	h.start()
	h.publish(
		message{ID: "p1", Body: "not json"},
		message{Body: `{"event":{"title":"t","groupHash":"g"}}`},
		message{Body: `{"projectId":"12345","event":{"title":"t","groupHash":"g"}}`},
		message{Body: `{"projectId":"` + project + `","event":{"title":"t"}}`},
		event(project, "still working", "g", true),
	)
	h.webhookBodies(1)

	conn, err := amqp.Dial(h.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	testenv.WaitFor(t, 10*time.Second, "4 dead letters", func() bool {
		d, ok, err := ch.Get(h.queue+".dead", true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			reasons = append(reasons, fmt.Sprint(d.Headers["x-klaxon-error"]))
			if d.MessageId == "p1" && string(d.Body) != "not json" {
				t.Errorf("dead letter body changed: %q", d.Body)
			}
		}
		return len(reasons) == 4
	})
	want := []string{"not a JSON object", "projectId is missing", `projectId "12345" is not a 24-hex ObjectId`, "event.groupHash is missing"}
	for i, w := range want {
		if !strings.Contains(reasons[i], w) {
			t.Errorf("dead letter %d says %q, want %q", i, reasons[i], w)
		}
	}
	q, err := ch.QueueDeclarePassive(h.queue, true, false, false, false, nil)
	if err != nil || q.Messages != 0 {
		t.Errorf("queue holds %d messages (%v), want none", q.Messages, err)
	}
}

// Three workers on one queue: each notification once.
func TestThreeWorkersNotifyOnce(t *testing.T) {
	h := newHarness(t)
	newRule := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	burst := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 50, "thresholdPeriod": 3600000, "channels": h.webhookOnly()})
	project := h.project(newRule, burst)
	for range 3 {
		h.start()
	}
	const groups = 40
	var msgs []message
	for i := range 3 * groups * 20 { // every group: 60 events, 3 of them "new"
		g := i % groups
		msgs = append(msgs, event(project, "boom", fmt.Sprint("g", g), i < 3*groups, fmt.Sprintf(`"repetitionId":"r%d"`, i)))
	}
	h.publish(msgs...)
	bodies := h.webhookBodies(2 * groups)
	ids := map[string]int{}
	for _, b := range bodies {
		ids[b["id"].(string)]++
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 2*groups)
	if len(ids) != 2*groups {
		t.Errorf("%d distinct notification ids, want %d", len(ids), 2*groups)
	}
}

// YAML rules, and Hawk's variable names for the broker and Redis.
func TestYAMLRulesAndHawkVariables(t *testing.T) {
	h := newHarness(t)
	project := "5e3eef0679fa3700a0198a49"
	file := t.TempDir() + "/rules.yaml"
	yaml := fmt.Sprintf(`%s:
  - id: new-errors
    isEnabled: true
    whatToReceive: ONLY_NEW
    including: [database]
    channels:
      webhook: {isEnabled: true, endpoint: %q, minPeriod: 0}
`, project, h.webhook.URL)
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	h.env["KLAXON_RULES_FILE"] = file
	h.env["REGISTRY_URL"] = h.env["KLAXON_AMQP_URL"]
	h.env["REDIS_URL"] = h.env["KLAXON_REDIS_URL"]
	delete(h.env, "KLAXON_AMQP_URL")
	delete(h.env, "KLAXON_REDIS_URL")
	h.start()
	h.publish(event(project, "Database unreachable", "g1", true), event(project, "other", "g2", true))
	b := h.webhookBodies(1)[0]
	if b["ruleId"] != "new-errors" || b["event"].(map[string]any)["groupHash"] != "g1" {
		t.Errorf("body %v", b)
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 1)
}

// waitQuiet checks that count settles at want and stays there while the
// worker has had time to act on anything left: the queue drained and idle.
func waitQuiet(t *testing.T, count func() int, want int) {
	t.Helper()
	stable := 0
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("the count to settle at %d", want), func() bool {
		if count() > want {
			t.Fatalf("count %d, want %d", count(), want)
		}
		if count() == want {
			stable++
		} else {
			stable = 0
		}
		return stable >= 25 // 0.5 s without change
	})
}

func countContaining(texts []string, s string) int {
	n := 0
	for _, t := range texts {
		if strings.Contains(t, s) {
			n++
		}
	}
	return n
}

func slackTexts(reqs []notifytest.SlackRequest) []string {
	var out []string
	for _, r := range reqs {
		out = append(out, r.Text)
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
