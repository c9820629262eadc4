// Package hawksender hands firings to Hawk's own sender workers instead of
// sending them (KLAXON_OUTPUT=hawk-senders, docs/hawk.md). For each message
// the deliverer would send on a channel, it publishes the task Hawk's
// notifier publishes for that channel: to the queue sender/<channel>, a
// JSON body
//
//	{"type": "event", "payload": {"projectId": …, "ruleId": …,
//	  "events": [{"key": groupHash, "count": n, "repetitionId": id|null}]}}
//
// Hawk's sender looks the project, rule and event up in its databases and
// renders its own templates: one event as "event", several as
// "several-events" over the channel's minPeriod. So a message maps to
// tasks this way:
//
//   - a single firing (new, threshold, regressed) is one task with one
//     event; count is the firing's count (1 for a new event, the window's
//     count for a threshold), which Hawk shows as "N new";
//   - a minPeriod digest is one task listing its groups, once each (a
//     group that fired more than once sums its counts, with the latest
//     repetitionId): Hawk renders it as several-events;
//   - the firings of several rules for one event grouped to one
//     destination are one task per rule, since Hawk's tasks name one rule;
//   - a "storm over" has no Hawk template, and a full digest's omitted
//     firings have no group hash: they are left out, logged and counted
//     (klaxon_hawk_tasks_total), never silently.
//
// A Channel is a notify.Channel, so the deliverer's claims, records,
// retries and digests apply unchanged: a task is published once per
// firing, up to the publish (a publish confirmed but not recorded, the
// worker killed between, is published again).
package hawksender

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
)

// TaskType is the type of every task a Channel publishes: Hawk's notifier
// sends only "event", and Hawk's sender picks "several-events" itself when
// a task lists more than one event.
const TaskType = "event"

// DefaultQueuePrefix is the prefix of Hawk's sender queues: each sender
// worker consumes sender/<its channel>.
const DefaultQueuePrefix = "sender/"

// Queue is the queue of Hawk's sender for channel: prefix + channel, e.g.
// sender/email.
func Queue(prefix, channel string) string { return prefix + channel }

// Task is the body of a sender task.
type Task struct {
	Type    string  `json:"type"` // TaskType
	Payload Payload `json:"payload"`
}

// Payload names the rule whose channel Hawk's sender sends on, and the
// events it is to tell of.
type Payload struct {
	ProjectID string  `json:"projectId"`
	RuleID    string  `json:"ruleId"`
	Events    []Event `json:"events"`
}

// Event is one group in a task.
type Event struct {
	Key   string `json:"key"` // the group hash
	Count int64  `json:"count"`
	// RepetitionID is the repetition that fired, null for a group's first
	// event (or when the event carried none).
	RepetitionID *string `json:"repetitionId"`
}

// Left is what a message held that no task carries.
type Left struct {
	StormOver int   // "storm over" firings: Hawk has no template for them
	Omitted   int64 // firings a full digest counted but did not list
}

// Tasks maps a message to the tasks Hawk's notifier would publish for it on
// one channel, in the order of its notifications, and says what it left out.
func Tasks(m *notify.Message) ([]Task, Left) {
	left := Left{Omitted: m.Omitted}
	var tasks []Task
	byRule := map[string]int{} // rule id → index in tasks
	for _, n := range m.Notifications {
		if n.Type == notify.TypeStormOver {
			left.StormOver++
			continue
		}
		rule := n.RuleID
		if rule == "" {
			rule = m.RuleID
		}
		i, ok := byRule[rule]
		if !ok || m.Grouped {
			// A grouped message names each rule once; a digest is one rule.
			i = len(tasks)
			byRule[rule] = i
			project := n.ProjectID
			if project == "" {
				project = m.ProjectID
			}
			tasks = append(tasks, Task{Type: TaskType, Payload: Payload{ProjectID: project, RuleID: rule}})
		}
		tasks[i].Payload.Events = addEvent(tasks[i].Payload.Events, n)
	}
	return tasks, left
}

// addEvent adds n's group to events, or to its entry when the group is
// there already: Hawk's several-events lists a group once.
func addEvent(events []Event, n notify.Notification) []Event {
	count := max(n.Count, 1)
	for i := range events {
		if events[i].Key == n.Event.GroupHash {
			events[i].Count += count
			if n.Event.RepetitionID != nil {
				events[i].RepetitionID = n.Event.RepetitionID
			}
			return events
		}
	}
	return append(events, Event{Key: n.Event.GroupHash, Count: count, RepetitionID: n.Event.RepetitionID})
}

// Publisher publishes with publisher confirms; *queue.Publisher is one.
type Publisher interface {
	Publish(ctx context.Context, msgs ...queue.Message) error
}

// Counter counts firings by channel and outcome; the worker's
// klaxon_hawk_tasks_total is one.
type Counter interface {
	Add(channel, outcome string, n float64)
}

// Outcomes a Counter is told of.
const (
	OutcomePublished = "published"
	OutcomeStormOver = "storm_over"
	OutcomeOmitted   = "omitted"
)

// Channel publishes a message's tasks to the queue of Hawk's sender for
// one rule channel. The endpoint is not in the task: Hawk's sender reads
// it from the rule.
type Channel struct {
	Name      string // the rule channel, e.g. "email"
	Queue     string // Queue(prefix, Name)
	Publisher Publisher
	Counter   Counter      // nil: not counted
	Log       *slog.Logger // [slog.Default()]
}

// Host is what the deliverer's per-host budgets and circuit count this
// channel's sends against: its queue, the one place they all go. Without
// colons, which would read as host:port, a name to look up in DNS.
func (c *Channel) Host(string) string { return strings.ReplaceAll(c.Queue, ":", "_") }

// Notify publishes m's tasks and returns once the broker has confirmed
// every one. A failure to publish is worth a retry (the broker down, the
// queue missing until Hawk's sender or the next declaration makes it).
func (c *Channel) Notify(ctx context.Context, _ string, m *notify.Message) (retry bool, err error) {
	tasks, left := Tasks(m)
	log := c.Log
	if log == nil {
		log = slog.Default()
	}
	if left.StormOver > 0 || left.Omitted > 0 {
		log.Info("firings left out of Hawk's sender task: Hawk's senders cannot render them",
			"channel", c.Name, "project", m.ProjectID, "rule", m.RuleID, "notification_id", m.ID,
			"storm_over", left.StormOver, "omitted", left.Omitted)
		c.count(OutcomeStormOver, float64(left.StormOver))
		c.count(OutcomeOmitted, float64(left.Omitted))
	}
	if len(tasks) == 0 {
		return false, nil
	}
	msgs := make([]queue.Message, 0, len(tasks))
	for i, t := range tasks {
		body, err := json.Marshal(t)
		if err != nil {
			return false, fmt.Errorf("encode Hawk sender task: %w", err)
		}
		id := m.ID
		if len(tasks) > 1 {
			id = fmt.Sprintf("%s/%d", m.ID, i)
		}
		msgs = append(msgs, queue.Message{RoutingKey: c.Queue, Body: body, MessageID: id, ContentType: "application/json"})
	}
	if err := c.Publisher.Publish(ctx, msgs...); err != nil {
		return true, fmt.Errorf("publish to Hawk's sender queue %s: %w", c.Queue, err)
	}
	c.count(OutcomePublished, float64(len(m.Notifications)-left.StormOver))
	return false, nil
}

func (c *Channel) count(outcome string, n float64) {
	if c.Counter != nil && n > 0 {
		c.Counter.Add(c.Name, outcome, n)
	}
}
