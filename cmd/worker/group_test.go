package main

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
)

// firingsOf lists the firings webhook bodies carry, as "<rule>/<group>",
// with the type of the body that carried each.
func firingsOf(t *testing.T, bodies []map[string]any) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	add := func(typ string, n map[string]any) {
		k := fmt.Sprint(n["ruleId"], "/", n["event"].(map[string]any)["groupHash"])
		out[k] = append(out[k], typ)
	}
	for _, b := range bodies {
		typ := b["type"].(string)
		ns, listed := b["notifications"].([]any)
		if !listed {
			add(typ, b)
			continue
		}
		for _, n := range ns {
			add(typ, n.(map[string]any))
		}
	}
	return out
}

// Rules of one project that fire for one event and share a destination
// send one message naming every rule, on every channel; another endpoint,
// and another project's rule on the same endpoint, get messages of their
// own; a rule inside its minPeriod goes to its own digest while the others
// are grouped; and the same events again send nothing.
func TestOneMessagePerDestination(t *testing.T) {
	h := newHarness(t)
	other := notifytest.NewWebhookSink(t)
	every := h.allChannels()
	every["loop"] = bson.M{"isEnabled": true, "endpoint": h.loop.URL, "minPeriod": 0}
	first := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": every})
	db := rule(bson.M{"whatToReceive": "ONLY_NEW", "including": bson.A{"database"}, "channels": every})
	elsewhere := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": other.URL, "minPeriod": 0}}})
	paced := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": h.webhook.URL, "minPeriod": 5}}})
	project := h.project(first, db, elsewhere, paced)
	neighbour := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	project2 := h.project(neighbour)
	w := h.start()

	e0 := event(project, "TypeError: x is undefined", "g0", true)
	e0.ID = "m0"
	h.publish(e0)
	// e0: first and paced on the webhook (paced starts its period), first
	// alone elsewhere; db does not match.
	b0 := h.webhookBodies(1)[0]
	if b0["type"] != "grouped" || fmt.Sprint(b0["ruleIds"]) != fmt.Sprint([]string{ruleID(first), ruleID(paced)}) {
		t.Fatalf("first message %v, want one grouped message of rules first and paced", b0)
	}
	// Inside paced's period: e1 and e2 fire first and db, grouped, and
	// paced, gathered for its digest; a neighbour project's rule on the
	// same endpoint, in the same batch, gets its own message.
	e1 := event(project, "database is down", "g1", true)
	e2 := event(project, "database timeout", "g2", true)
	n1 := event(project2, "database is down", "g1", true)
	e1.ID, e2.ID, n1.ID = "m1", "m2", "n1"
	h.publish(e1, e2, n1)
	bodies := h.webhookBodies(5) // e0, e1, e2, the neighbour's, paced's digest
	// The same events again, as a redelivery would bring them.
	h.publish(e0, e1, e2, n1)
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 5)

	got := firingsOf(t, bodies)
	want := map[string][]string{
		ruleID(first) + "/g0": {"grouped"}, ruleID(paced) + "/g0": {"grouped"},
		ruleID(first) + "/g1": {"grouped"}, ruleID(db) + "/g1": {"grouped"}, ruleID(paced) + "/g1": {"digest"},
		ruleID(first) + "/g2": {"grouped"}, ruleID(db) + "/g2": {"grouped"}, ruleID(paced) + "/g2": {"digest"},
		ruleID(neighbour) + "/g1": {"new"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("webhook firings\n%v\nwant\n%v", got, want)
	}
	for _, b := range bodies {
		if b["type"] != "grouped" {
			continue
		}
		if b["version"] != "4" || b["projectId"] != project || !strings.HasPrefix(b["id"].(string), "group-") {
			t.Errorf("grouped body %v", b)
		}
		for _, r := range h.webhook.Requests() {
			if strings.Contains(string(r.Body), b["id"].(string)) && r.Header.Get("Idempotency-Key") != b["id"] {
				t.Errorf("Idempotency-Key %q, body id %v", r.Header.Get("Idempotency-Key"), b["id"])
			}
		}
	}
	if _, err := other.WaitFor(3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, func() int { return len(other.Requests()) }, 3)

	// Every other channel: e0 for first alone, e1 and e2 one message each
	// naming both rules.
	const both = "2 rules fired"
	slackReqs, err := h.slack.WaitFor(3, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n := countContaining(slackTexts(slackReqs), both); n != 2 {
		t.Errorf("%d Slack messages say %q, want 2: %q", n, both, slackTexts(slackReqs))
	}
	loopReqs, err := h.loop.WaitFor(3, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var loopTexts []string
	for _, r := range loopReqs {
		loopTexts = append(loopTexts, r.Text)
	}
	if n := countContaining(loopTexts, "- `new errors, title containing \"database\"` — New event"); n != 2 {
		t.Errorf("%d Loop messages name rule db, want 2: %q", n, loopTexts)
	}
	tgReqs, err := h.telegram.WaitFor(3, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var tgTexts []string
	for _, r := range tgReqs {
		tgTexts = append(tgTexts, r.Visible)
	}
	if n := countContaining(tgTexts, both); n != 2 {
		t.Errorf("%d Telegram messages say %q, want 2: %q", n, both, tgTexts)
	}
	mails, err := h.smtp.WaitFor(3, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range mails {
		msg, err := m.Parse()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, msg.Header.Get("X-Klaxon-Notification-Id"))
	}
	if n := len(slices.DeleteFunc(ids, func(id string) bool { return !strings.HasPrefix(id, "group-") })); n != 2 {
		t.Errorf("%d grouped emails, want 2", n)
	}
	waitQuiet(t, func() int {
		return len(h.slack.Requests()) + len(h.loop.Requests()) + len(h.telegram.Requests()) + len(h.smtp.Messages())
	}, 12)
	if v := w.metric(t, "klaxon_notifications_total", "channel", "webhook", "outcome", "digested"); v != 2 {
		t.Errorf("digested = %v, want 2", v)
	}
}

// A worker killed (SIGKILL) after part of an event's messages went: the
// webhook's grouped message was sent, Slack's was refused once and waits
// for its retry. A second worker sends Slack's, once; the webhook's is not
// sent again, nor is anything when the same event comes again.
func TestGroupedMessagesSurviveAKilledWorker(t *testing.T) {
	h := newHarness(t)
	channels := bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": h.webhook.URL, "minPeriod": 0},
		"slack":   bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0},
	}
	a := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": channels})
	b := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": channels})
	project := h.project(a, b)
	h.slack.Fail(notifytest.Failure{Status: http.StatusServiceUnavailable})
	startWorker := func() (*worker, func()) {
		w, cmd, exited, _ := h.startBinary("KLAXON_SEND_TIMEOUT=2s")
		return w, func() {
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-exited
		}
	}
	w, kill := startWorker()
	ev := event(project, "boom", "g", true)
	ev.ID = "m1"
	h.publish(ev)
	// Killed once the webhook's message is recorded sent and Slack's is
	// on its way to a retry.
	w.waitMetric(t, 30*time.Second, "the webhook's message sent", func(v float64) bool { return v == 1 },
		"klaxon_notifications_total", "channel", "webhook", "outcome", "sent")
	w.waitMetric(t, 30*time.Second, "Slack's message retried", func(v float64) bool { return v == 1 },
		"klaxon_notifications_total", "channel", "slack", "outcome", "retried")
	kill()
	startWorker()
	h.publish(ev)
	slackReqs, err := h.slack.WaitFor(2, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) + len(h.slack.Requests()) }, 3)
	if slackReqs[0].Status != http.StatusServiceUnavailable || slackReqs[1].Status != http.StatusOK ||
		slackReqs[0].Text != slackReqs[1].Text || !strings.Contains(slackReqs[1].Text, "2 rules fired") {
		t.Errorf("Slack: %d %q, then %d %q; want the grouped message refused, then the same accepted",
			slackReqs[0].Status, slackReqs[0].Text, slackReqs[1].Status, slackReqs[1].Text)
	}
	body := h.webhookBodies(1)[0]
	if body["type"] != "grouped" || len(body["notifications"].([]any)) != 2 {
		t.Errorf("webhook body %v, want one grouped message of both rules", body)
	}
}
