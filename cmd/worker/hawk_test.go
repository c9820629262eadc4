package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/notify/hawksender"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// hawkTask is the task Hawk's notifier publishes to a sender queue, as
// Hawk documents its fields: {"type":"event","payload":{"projectId",
// "ruleId","events":[{"key":groupHash,"count","repetitionId"}]}}.
func hawkTask(project, rule string, events ...string) string {
	return fmt.Sprintf(`{"type":"event","payload":{"projectId":%q,"ruleId":%q,"events":[%s]}}`,
		project, rule, strings.Join(events, ","))
}

// hawkEvent is one entry of a task's events; repetition "" is null.
func hawkEvent(group string, count int, repetition string) string {
	rep := "null"
	if repetition != "" {
		rep = fmt.Sprintf("%q", repetition)
	}
	return fmt.Sprintf(`{"key":%q,"count":%d,"repetitionId":%s}`, group, count, rep)
}

// hawkShape re-encodes a task with sorted keys and its events in key
// order (Hawk's several-events orders them itself), so that tasks compare
// as values; a body that is not JSON fails the test.
func hawkShape(t *testing.T, body []byte) string {
	t.Helper()
	var task map[string]any
	if err := json.Unmarshal(body, &task); err != nil {
		t.Fatalf("task %s: %v", body, err)
	}
	if p, ok := task["payload"].(map[string]any); ok {
		if evs, ok := p["events"].([]any); ok {
			slices.SortFunc(evs, func(a, b any) int {
				return strings.Compare(fmt.Sprint(a.(map[string]any)["key"]), fmt.Sprint(b.(map[string]any)["key"]))
			})
		}
	}
	out, _ := json.Marshal(task)
	return string(out)
}

// hawkSenders is what Hawk's sender workers would receive: the tasks taken
// so far from each of a harness' sender queues, by channel.
type hawkSenders struct {
	h     *harness
	tasks map[string][]string
}

func (h *harness) hawkSenders() *hawkSenders {
	h.env["KLAXON_OUTPUT"] = "hawk-senders"
	return &hawkSenders{h: h, tasks: map[string][]string{}}
}

// take takes what is in the queues now and returns how many tasks there
// are in all.
func (s *hawkSenders) take() int {
	n := 0
	for _, c := range rules.ChannelNames {
		for _, d := range testenv.Take(s.h.t, hawksender.Queue(hawkSenderPrefix(s.h.prefix), c)) {
			s.tasks[c] = append(s.tasks[c], hawkShape(s.h.t, d.Body))
		}
		n += len(s.tasks[c])
	}
	return n
}

// waitFor waits until n tasks in all have arrived.
func (s *hawkSenders) waitFor(n int) {
	s.h.t.Helper()
	testenv.WaitFor(s.h.t, 30*time.Second, fmt.Sprintf("%d tasks in Hawk's sender queues", n), func() bool { return s.take() >= n })
}

// check compares the tasks of each channel with want, as multisets.
func (s *hawkSenders) check(want map[string][]string) {
	s.h.t.Helper()
	for _, c := range rules.ChannelNames {
		var w []string
		for _, task := range want[c] {
			w = append(w, hawkShape(s.h.t, []byte(task)))
		}
		got := slices.Sorted(slices.Values(s.tasks[c]))
		slices.Sort(w)
		if !slices.Equal(got, w) {
			s.h.t.Errorf("%s tasks:\n%s\nwant:\n%s", c, strings.Join(got, "\n"), strings.Join(w, "\n"))
		}
	}
}

// noProviderReached fails the test if Klaxon sent anything itself.
func (h *harness) noProviderReached() {
	h.t.Helper()
	if n := len(h.webhook.Requests()) + len(h.slack.Requests()) + len(h.loop.Requests()) +
		len(h.telegram.Requests()) + len(h.smtp.Messages()); n > 0 {
		h.t.Errorf("Klaxon sent %d messages itself; with hawk-senders only Hawk's senders send", n)
	}
}

// With KLAXON_OUTPUT=hawk-senders the sender queues get exactly the tasks
// Hawk's notifier would publish: one per firing per enabled channel, a
// minPeriod digest as one task of several events, rules grouped to one
// destination as a task each; a disabled channel gets none, nothing is
// sent by Klaxon itself, and the same events again publish nothing.
func TestHawkSendersGetHawksTasks(t *testing.T) {
	h := newHarness(t)
	senders := h.hawkSenders()
	every := h.allChannels()
	every["loop"] = bson.M{"isEnabled": true, "endpoint": h.loop.URL, "minPeriod": 0}
	fresh := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": every})
	paced := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"telegram": bson.M{"isEnabled": true, "endpoint": "-1001234", "minPeriod": 5},
		"slack":    bson.M{"isEnabled": false, "endpoint": h.slack.URL, "minPeriod": 0}}})
	counted := rule(bson.M{"whatToReceive": "SEEN_MORE", "including": bson.A{"timeout"}, "threshold": 3, "thresholdPeriod": 60000,
		"channels": h.webhookOnly()})
	project := h.project(fresh, paced, counted)
	w := h.start()

	e0 := event(project, "TypeError: x is undefined", "g0", true)
	e0.ID = "m0"
	h.publish(e0)
	// fresh on every channel; paced on Telegram starts its period, in one
	// grouped message with fresh's that becomes a task for each rule.
	senders.waitFor(6)
	e1 := event(project, "TypeError: y is undefined", "g1", true)
	e2 := event(project, "RangeError: too deep", "g2", true)
	e1.ID, e2.ID = "m1", "m2"
	var timeouts []message
	for i := 1; i <= 3; i++ {
		m := event(project, "upstream timeout", "g3", false, fmt.Sprintf(`"repetitionId":"r%d"`, i))
		m.ID = fmt.Sprintf("t%d", i)
		timeouts = append(timeouts, m)
	}
	h.publish(append([]message{e1, e2}, timeouts...)...)
	// e1 and e2: fresh everywhere (10), paced's digest of both at the end
	// of its period (1); the third timeout: counted (1).
	senders.waitFor(18)
	// The same events again, as a redelivery would bring them.
	h.publish(append([]message{e0, e1, e2}, timeouts...)...)
	testenv.WaitFor(t, 30*time.Second, "the redelivered events counted as duplicates", func() bool {
		return w.metric(t, "klaxon_events_total", "outcome", "duplicate") >= 6
	})
	waitQuiet(t, senders.take, 18)

	one := func(rule bson.M, group string) string {
		return hawkTask(project, ruleID(rule), hawkEvent(group, 1, ""))
	}
	byFresh := []string{one(fresh, "g0"), one(fresh, "g1"), one(fresh, "g2")}
	senders.check(map[string][]string{
		"email": byFresh, "slack": byFresh, "loop": byFresh,
		"webhook": append(slices.Clone(byFresh), hawkTask(project, ruleID(counted), hawkEvent("g3", 3, "r3"))),
		"telegram": append(slices.Clone(byFresh), one(paced, "g0"),
			hawkTask(project, ruleID(paced), hawkEvent("g1", 1, ""), hawkEvent("g2", 1, ""))),
	})
	if n := w.metric(t, "klaxon_hawk_tasks_total", "channel", "telegram", "outcome", "published"); n != 6 {
		t.Errorf("klaxon_hawk_tasks_total{telegram,published} = %v, want 6 (the digest's two firings count apart)", n)
	}
	h.noProviderReached()
}

// A storm-over message has no rendering in Hawk's senders: the firing
// goes to them, its storm over does not, and the worker says so in a log
// line and klaxon_hawk_tasks_total rather than dropping it in silence.
func TestHawkSendersLeaveStormOverOutAloud(t *testing.T) {
	h := newHarness(t)
	senders := h.hawkSenders()
	stormy := seenMore("database", bson.M{"stormOver": true, "channels": h.webhookOnly()})
	project := h.project(stormy)
	w := h.start()

	h.publish(burst(project, "DatabaseError", "db", tenSecondsAgo(), 6)...)
	const leftOut = "firings left out of Hawk's sender task: Hawk's senders cannot render them"
	testenv.WaitFor(t, 30*time.Second, "the storm over left out", func() bool { return h.logCount(leftOut) >= 1 })
	senders.waitFor(1)
	waitQuiet(t, senders.take, 1)
	senders.check(map[string][]string{"webhook": {hawkTask(project, ruleID(stormy), hawkEvent("db", 5, ""))}})
	if lines := h.logs.logLines(leftOut); len(lines) != 1 || lines[0]["storm_over"] != 1.0 || lines[0]["channel"] != "webhook" {
		t.Errorf("log lines %v: want one naming the webhook's storm over", lines)
	}
	for line := range strings.Lines(h.logs.String()) {
		if strings.Contains(line, leftOut) {
			for _, problem := range logLineProblems([]byte(line)) {
				t.Errorf("%s in %s", problem, line)
			}
		}
	}
	if n := w.metric(t, "klaxon_hawk_tasks_total", "channel", "webhook", "outcome", "storm_over"); n != 1 {
		t.Errorf("klaxon_hawk_tasks_total{webhook,storm_over} = %v, want 1", n)
	}
	h.noProviderReached()
}

// Hawk's sender workers declare their queues as amqplib's assertQueue
// does (durable, classic, no arguments) at every start; a queue Klaxon
// made otherwise, quorum under KLAXON_QUEUE_TYPE say, would refuse them
// with PRECONDITION_FAILED. So the worker declares them as Hawk does,
// before any task, whatever the type of its own queues.
func TestHawkSenderQueuesAreDeclaredAsHawkDeclaresThem(t *testing.T) {
	h := newHarness(t)
	h.hawkSenders()
	h.env["KLAXON_QUEUE_TYPE"] = "quorum"
	h.start()
	for _, c := range rules.ChannelNames {
		q := hawksender.Queue(hawkSenderPrefix(h.prefix), c)
		withChannel(t, h.amqpURL, func(ch *amqp.Channel) {
			if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
				t.Errorf("%s does not wait for Hawk's sender: %v", q, err)
			}
		})
		withChannel(t, h.amqpURL, func(ch *amqp.Channel) {
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				t.Errorf("Hawk's sender declaring %s: %v", q, err)
			}
		})
		withChannel(t, h.amqpURL, func(ch *amqp.Channel) {
			if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
				t.Errorf("%s is not a classic queue: %v", q, err)
			}
		})
	}
}

// A group marked resolved in Hawk that comes back fires an ONLY_NEW rule
// as a regression; Hawk's senders have no wording for one, so it reaches
// them as the event it is, with the repetition that brought it back, once.
func TestHawkSendersGetRegressionsAsEvents(t *testing.T) {
	h := newHarness(t)
	senders := h.hawkSenders()
	fresh := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	project := h.project(fresh)
	testenv.HawkGroup(t, h.db, project, "g-res", 50, 1700000000, 2, bson.M{"resolved": int32(1700500000)})
	h.env["MONGO_EVENTS_DATABASE_URI"] = h.env["KLAXON_MONGO_URL"]
	w := h.start()

	h.publish(event(project, "TypeError: x is undefined", "g-res", false, `"repetitionId":"r1"`),
		event(project, "TypeError: x is undefined", "g-res", false, `"repetitionId":"r2"`))
	senders.waitFor(1)
	testenv.WaitFor(t, 30*time.Second, "both events counted", func() bool {
		return w.metric(t, "klaxon_events_total", "outcome", "counted") >= 2
	})
	waitQuiet(t, senders.take, 1)
	senders.check(map[string][]string{"webhook": {hawkTask(project, ruleID(fresh), hawkEvent("g-res", 1, "r1"))}})
	if n := w.metric(t, "klaxon_firings_total", "type", "regressed"); n != 1 {
		t.Errorf("klaxon_firings_total{regressed} = %v, want 1: the task must be the regression's", n)
	}
	h.noProviderReached()
}
