package main

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// With Hawk's events database configured (here the rules' FerretDB
// database, under Hawk's variable name), events through the broker notify
// with the group's history on every channel; a group marked resolved
// fires the ONLY_NEW rule as "regressed" once per resolution; an ignored
// group never notifies.
func TestHawkEventsDatabaseThroughTheWorker(t *testing.T) {
	h := newHarness(t)
	channels := h.allChannels()
	channels["loop"] = bson.M{"isEnabled": true, "endpoint": h.loop.URL, "minPeriod": 0}
	fresh := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": channels})
	storm := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 2, "thresholdPeriod": hour, "channels": h.webhookOnly()})
	project := h.project(fresh, storm)
	const firstSeen, resolved, resolvedAgain = 1700000000, 1700500000, 1700900000
	testenv.HawkGroup(t, h.db, project, "g-new", 1234, firstSeen, 3, nil)
	testenv.HawkGroup(t, h.db, project, "g-res", 50, firstSeen, 2, bson.M{"resolved": int32(resolved), "starred": int32(resolved)})
	testenv.HawkGroup(t, h.db, project, "g-ign", 7, firstSeen, 1, bson.M{"ignored": int32(resolved)})
	h.env["MONGO_EVENTS_DATABASE_URI"] = h.env["KLAXON_MONGO_URL"]
	w := h.start()

	// A new group: every channel shows its history as Hawk's messages do.
	h.publish(event(project, "TypeError: x is undefined", "g-new", true))
	b := h.webhookBodies(1)[0]
	hist, _ := b["history"].(map[string]any)
	if b["type"] != "new" || hist["totalCount"] != 1234.0 || hist["daysRepeated"] != 3.0 ||
		hist["firstSeen"] != "2023-11-14T22:13:20Z" || hist["topFrame"] != "app/cart.js:42" {
		t.Fatalf("webhook body %v: want the group's history", b)
	}
	const seen, frame = "Seen 1234 times in total, first at 2023-11-14T22:13:20Z, on 3 days", "Top frame: app/cart.js:42"
	slackReqs, err := h.slack.WaitFor(1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	loopReqs, err := h.loop.WaitFor(1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tgReqs, err := h.telegram.WaitFor(1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mails, err := h.smtp.WaitFor(1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := mails[0].Parts()
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"slack": strings.Join(blockTextsOf(slackReqs[0].Blocks), "\n"), "loop": loopReqs[0].Text,
		"telegram": tgReqs[0].Visible, "email": parts["text/plain"], "email HTML": parts["text/html"],
	} {
		if !strings.Contains(text, seen) || !strings.Contains(text, frame) {
			t.Errorf("%s lacks the history lines %q and %q:\n%s", name, seen, frame, text)
		}
	}

	// A group marked resolved comes back: regressed, once.
	rep := 0
	repeat := func(group string, isNew bool) message {
		rep++
		return event(project, "TypeError: x is undefined", group, isNew, fmt.Sprintf(`"repetitionId":"r%d"`, rep))
	}
	h.publish(repeat("g-res", false), repeat("g-res", false))
	regressed := func() []map[string]any {
		var out []map[string]any
		for _, r := range h.webhook.Requests() {
			var b map[string]any
			if r.JSON(&b) == nil && b["type"] == "regressed" {
				out = append(out, b)
			}
		}
		return out
	}
	testenv.WaitFor(t, 30*time.Second, "the regression", func() bool { return len(regressed()) == 1 })
	r := regressed()[0]
	if r["ruleId"] != ruleID(fresh) || r["resolvedAt"] != "2023-11-20T17:06:40Z" || r["history"].(map[string]any)["totalCount"] != 50.0 {
		t.Errorf("regressed body %v: want rule fresh, resolved at 1700500000, the group's history", r)
	}

	// An ignored group: new, and past the storm's threshold, never told.
	ignored := w.metric(t, "klaxon_events_total", "outcome", "unmatched")
	h.publish(repeat("g-ign", true), repeat("g-ign", false), repeat("g-ign", false), repeat("g-ign", false))
	w.waitMetric(t, 30*time.Second, "the ignored group's 4 events", func(v float64) bool { return v >= ignored+4 },
		"klaxon_events_total", "outcome", "unmatched")

	// Reopened and resolved again in the tracker: once the worker's cached
	// marks (5 s) are stale, the group's next event is a new regression.
	testenv.HawkMark(t, h.db, project, "g-res", "resolved", 0)
	testenv.HawkMark(t, h.db, project, "g-res", "resolved", resolvedAgain)
	testenv.WaitFor(t, 60*time.Second, "the second resolution's regression", func() bool {
		if len(regressed()) == 2 {
			return true
		}
		h.publish(repeat("g-res", false))
		return false
	})
	if r := regressed()[1]; r["resolvedAt"] != "2023-11-25T08:13:20Z" || r["id"] == regressed()[0]["id"] {
		t.Errorf("second regression %v: want resolved at 1700900000, an id of its own", r)
	}
	h.publish(repeat("g-res", false), repeat("g-res", false))
	// g-new, two regressions; g-res's storm (its second event) once.
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 4)
	for _, b := range h.webhookBodies(4) {
		if b["event"].(map[string]any)["groupHash"] == "g-ign" {
			t.Errorf("the ignored group notified: %v", b)
		}
	}
}

// blockTextsOf is the text of Slack blocks: sections' and context elements'.
func blockTextsOf(blocks []map[string]any) []string {
	var out []string
	for _, b := range blocks {
		if t, ok := b["text"].(map[string]any); ok {
			out = append(out, fmt.Sprint(t["text"]))
		}
		if els, ok := b["elements"].([]any); ok {
			for _, e := range els {
				if m, ok := e.(map[string]any); ok {
					out = append(out, fmt.Sprint(m["text"]))
				}
			}
		}
	}
	return out
}

// With Hawk's events database, the default link is Hawk's own page of the
// event, by the group document's _id, as Hawk's senders link; a group the
// database does not hold (the grouper has not written it yet) gets the
// fallback, the project's page. Slack shows the same link as the webhook.
func TestLinksNameTheEventByItsIDInHawksDatabase(t *testing.T) {
	h := newHarness(t)
	channels := h.webhookOnly()
	channels["slack"] = bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0}
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": channels}))
	id := testenv.HawkGroup(t, h.db, project, "g-known", 1, 1700000000, 1, nil)
	h.env["KLAXON_EVENTS_MONGO_URL"] = h.env["KLAXON_MONGO_URL"]
	h.start()

	h.publish(event(project, "TypeError: x is undefined", "g-known", true))
	h.publish(event(project, "TypeError: y is undefined", "g-unwritten", true))
	urls := map[string]string{}
	for _, b := range h.webhookBodies(2) {
		ev := b["event"].(map[string]any)
		urls[ev["groupHash"].(string)] = ev["url"].(string)
	}
	byID := "https://garage.hawk.so/project/" + project + "/event/" + id + "/overview"
	if want := map[string]string{"g-known": byID, "g-unwritten": "https://garage.hawk.so/project/" + project}; !maps.Equal(urls, want) {
		t.Errorf("links %v, want %v", urls, want)
	}
	if said := h.logs.logLines(eventIDUnknown); len(said) != 0 {
		t.Errorf("with an events database the worker said the event's id is unknown: %v", said)
	}
	reqs, err := h.slack.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, r := range reqs {
		texts = append(texts, strings.Join(blockTextsOf(r.Blocks), "\n"))
	}
	if got := countContaining(texts, byID+">") + countContaining(texts, byID+"|"); got != 1 {
		t.Errorf("%d Slack messages link to %s, want 1: %q", got, byID, texts)
	}
}

// The group's total in a message is never below the counts it reports
// beside it: Hawk's count is read through a cache, so the firing of a
// burst may see the count from before it (here the database still holds
// 3 when the rule counts its tenth event in a minute). The group's first
// occurrence is the burst's first event, which counts at that time.
func TestHistoryTotalIsNeverBelowTheWindowsCount(t *testing.T) {
	h := newHarness(t)
	channels := h.webhookOnly()
	channels["slack"] = bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0}
	project := h.project(rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 10, "thresholdPeriod": 60_000, "channels": channels}))
	testenv.HawkGroup(t, h.db, project, "g-burst", 3, int32(time.Now().Unix()), 2, nil)
	h.env["KLAXON_EVENTS_MONGO_URL"] = h.env["KLAXON_MONGO_URL"]
	h.start()

	var burst []message
	for i := range 10 {
		burst = append(burst, event(project, "DatabaseError: timeout", "g-burst", i == 0, fmt.Sprintf(`"repetitionId":"b%d"`, i)))
	}
	h.publish(burst...)
	b := h.webhookBodies(1)[0]
	hist, _ := b["history"].(map[string]any)
	if b["count"] != 10.0 || hist["totalCount"] != 10.0 || hist["daysRepeated"] != 2.0 {
		t.Errorf("body %v: want count 10 and the history's totalCount 10 (the database's 3 is older)", b)
	}
	reqs, err := h.slack.WaitFor(1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(blockTextsOf(reqs[0].Blocks), "\n")
	if !strings.Contains(text, "10 events in the last 1 minute") || !strings.Contains(text, "Seen 10 times in total") {
		t.Errorf("Slack message: want the window's 10 events and a total of 10:\n%s", text)
	}
}

// A countBy users rule needs event.user, which stock Hawk never sends:
// behind it such a rule cannot fire. The worker says so, once per rule and
// hour however many events come (each counts in
// klaxon_rules_starved_total), leaves the rule counting events of the same
// project alone, and counts events that do carry a user as before.
func TestUsersRuleWithoutUsersIsReportedStarved(t *testing.T) {
	h := newHarness(t)
	users := rule(bson.M{"whatToReceive": "SEEN_MORE", "countBy": "users", "threshold": 2, "thresholdPeriod": hour, "channels": h.webhookOnly()})
	plain := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 100, "thresholdPeriod": hour, "channels": h.webhookOnly()})
	project := h.project(users, plain)
	w := h.start()

	stock := func(i int) message {
		return event(project, "TypeError: x is undefined", "g", i == 0, fmt.Sprintf(`"repetitionId":"s%d"`, i))
	}
	h.publish(stock(0), stock(1), stock(2))
	w.waitMetric(t, 30*time.Second, "3 starved events", func(v float64) bool { return v == 3 }, "klaxon_rules_starved_total", "reason", "no_user")
	h.publish(stock(3), stock(4))
	w.waitMetric(t, 30*time.Second, "5 starved events", func(v float64) bool { return v == 5 }, "klaxon_rules_starved_total", "reason", "no_user")
	warned := h.logs.logLines("rule starved: its events lack a field it counts by, so it cannot fire on them")
	if len(warned) != 1 || warned[0]["rule"] != ruleID(users) || warned[0]["project"] != project || warned[0]["field"] != "event.user" {
		t.Errorf("warnings %v: want one, for the users rule, naming event.user", warned)
	}
	if n := len(h.webhook.Requests()); n != 0 {
		t.Errorf("%d notifications from events without users", n)
	}

	// Events with users: counted, and the rule fires at its second user.
	h.publish(event(project, "TypeError: x is undefined", "g", false, `"repetitionId":"u1"`, `"user":{"id":"alice"}`),
		event(project, "TypeError: x is undefined", "g", false, `"repetitionId":"u2"`, `"user":{"id":"bob"}`))
	b := h.webhookBodies(1)[0]
	if b["ruleId"] != ruleID(users) || b["countBy"] != "users" || b["count"] != 2.0 {
		t.Errorf("body %v: want the users rule firing at 2 users", b)
	}
	if v := w.metric(t, "klaxon_rules_starved_total", "reason", "no_user"); v != 5 {
		t.Errorf("klaxon_rules_starved_total = %v after events with users, want still 5", v)
	}
}

// Behind stock Hawk, whose events carry neither a user nor a time, a
// countBy users rule fires with Hawk's events database: the group's first
// event takes its user and time from the group's document, each
// repetition from its own (the user in the delta the grouper stored, or
// the first occurrence's where it is the same). Nothing starves. A
// backlog, here a group's events of hours ago published at once, counts
// at the times they happened: one user an hour never fires a rule of 3
// users a minute.
func TestUsersRuleFiresBehindStockHawkWithItsEventsDatabase(t *testing.T) {
	h := newHarness(t)
	users := rule(bson.M{"whatToReceive": "SEEN_MORE", "countBy": "users", "threshold": 3, "thresholdPeriod": 60_000, "channels": h.webhookOnly()})
	project := h.project(users)
	now := int32(time.Now().Unix())
	testenv.HawkGroup(t, h.db, project, "g", 4, now-30, 1, nil)
	testenv.HawkGroupUser(t, h.db, project, "g", "alice")
	testenv.HawkGroup(t, h.db, project, "old", 3, now-3*3600, 1, nil)
	testenv.HawkGroupUser(t, h.db, project, "old", "u0")
	stock := func(group, repetition string) message {
		if repetition == "" {
			return event(project, "TypeError: x is undefined", group, true)
		}
		return event(project, "TypeError: x is undefined", group, false, fmt.Sprintf(`"repetitionId":%q`, repetition))
	}
	msgs := []message{
		stock("old", ""),
		stock("old", testenv.HawkRepetition(t, h.db, project, "old", now-2*3600, testenv.HawkUserDelta("u1"))),
		stock("old", testenv.HawkRepetition(t, h.db, project, "old", now-3600, testenv.HawkUserDelta("u2"))),
		stock("g", ""),
		stock("g", testenv.HawkRepetition(t, h.db, project, "g", now-20, testenv.HawkUserDelta("bob"))),
		stock("g", testenv.HawkRepetition(t, h.db, project, "g", now-10, `{"context":{"b":[2]}}`)), // alice again
		stock("g", testenv.HawkRepetition(t, h.db, project, "g", now-5, testenv.HawkUserDelta("carol"))),
	}
	h.env["MONGO_EVENTS_DATABASE_URI"] = h.env["KLAXON_MONGO_URL"]
	w := h.start()

	h.publish(msgs...)
	b := h.webhookBodies(1)[0]
	ev, _ := b["event"].(map[string]any)
	if b["ruleId"] != ruleID(users) || b["countBy"] != "users" || b["count"] != 3.0 || ev["groupHash"] != "g" {
		t.Errorf("body %v: want the users rule firing for g at its third user", b)
	}
	if at, err := time.Parse(time.RFC3339, fmt.Sprint(b["firedAt"])); err != nil || !at.Equal(time.Unix(int64(now-5), 0)) {
		t.Errorf("firedAt %v: want carol's repetition's time, %v", b["firedAt"], time.Unix(int64(now-5), 0).UTC())
	}
	w.waitMetric(t, 30*time.Second, "every event counted", func(v float64) bool { return v == float64(len(msgs)) },
		"klaxon_events_total", "outcome", "counted")
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 1)
	if v := w.metric(t, "klaxon_rules_starved_total", "reason", "no_user"); v != 0 {
		t.Errorf("klaxon_rules_starved_total = %v, want 0: every event has its user from Hawk's documents", v)
	}
	if warned := h.logs.logLines("rule starved: its events lack a field it counts by, so it cannot fire on them"); len(warned) != 0 {
		t.Errorf("starved warnings %v, want none", warned)
	}
}
