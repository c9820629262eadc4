package hawksender_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/hawksender"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

var firedAt = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func rep(s string) *string { return &s }

// firing is a notification of rule in project p for group, as the
// evaluator makes it.
func firing(typ, rule, group string, count int64, repetition *string) notify.Notification {
	return notify.Notification{ID: typ + "-" + rule + "-" + group, Type: typ, ProjectID: "p1", RuleID: rule,
		Event: notify.Event{Title: "TypeError", GroupHash: group, RepetitionID: repetition}, Count: count, FiredAt: firedAt}
}

// canonical re-encodes a JSON value with sorted keys, so that a fixture
// and a task compare whatever their field order.
func canonical(t *testing.T, raw []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// The fixtures are Hawk's sender task as its notifier publishes it:
// {"type":"event","payload":{"projectId","ruleId","events":[{"key",
// "count","repetitionId"}]}}, repetitionId null for a first occurrence.
func TestTasksAreWhatHawksNotifierPublishes(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  *notify.Message
		want []string
		left hawksender.Left
	}{
		{"a new event: one event, count 1, no repetition",
			&notify.Message{ID: "n1", ProjectID: "p1", RuleID: "r1", Notifications: []notify.Notification{firing(notify.TypeNew, "r1", "g1", 1, nil)}},
			[]string{`{"type":"event","payload":{"projectId":"p1","ruleId":"r1","events":[{"key":"g1","count":1,"repetitionId":null}]}}`}, hawksender.Left{}},
		{"a threshold: the window's count and the repetition that fired",
			&notify.Message{ID: "n2", ProjectID: "p1", RuleID: "r1", Notifications: []notify.Notification{firing(notify.TypeThreshold, "r1", "g1", 100, rep("65f0a1"))}},
			[]string{`{"type":"event","payload":{"projectId":"p1","ruleId":"r1","events":[{"key":"g1","count":100,"repetitionId":"65f0a1"}]}}`}, hawksender.Left{}},
		{"a regression renders as an event",
			&notify.Message{ID: "n3", ProjectID: "p1", RuleID: "r1", Notifications: []notify.Notification{firing(notify.TypeRegressed, "r1", "g1", 1, rep("65f0a2"))}},
			[]string{`{"type":"event","payload":{"projectId":"p1","ruleId":"r1","events":[{"key":"g1","count":1,"repetitionId":"65f0a2"}]}}`}, hawksender.Left{}},
		{"a digest is one task of several events, a group once, its counts summed",
			&notify.Message{ID: "digest-1", ProjectID: "p1", RuleID: "r1", Digest: true, Notifications: []notify.Notification{
				firing(notify.TypeThreshold, "r1", "g1", 10, rep("a")),
				firing(notify.TypeThreshold, "r1", "g2", 10, rep("b")),
				firing(notify.TypeThreshold, "r1", "g1", 10, rep("c")),
			}},
			[]string{`{"type":"event","payload":{"projectId":"p1","ruleId":"r1","events":[` +
				`{"key":"g1","count":20,"repetitionId":"c"},{"key":"g2","count":10,"repetitionId":"b"}]}}`}, hawksender.Left{}},
		{"several rules grouped for one event: a task per rule",
			&notify.Message{ID: "group-1", ProjectID: "p1", Grouped: true, Notifications: []notify.Notification{
				firing(notify.TypeNew, "r1", "g1", 1, nil), firing(notify.TypeNew, "r2", "g1", 1, nil),
			}},
			[]string{
				`{"type":"event","payload":{"projectId":"p1","ruleId":"r1","events":[{"key":"g1","count":1,"repetitionId":null}]}}`,
				`{"type":"event","payload":{"projectId":"p1","ruleId":"r2","events":[{"key":"g1","count":1,"repetitionId":null}]}}`,
			}, hawksender.Left{}},
		{"a storm over has no Hawk template: left out",
			&notify.Message{ID: "over-1", ProjectID: "p1", RuleID: "r1", Notifications: []notify.Notification{firing(notify.TypeStormOver, "r1", "g1", 40, nil)}},
			nil, hawksender.Left{StormOver: 1}},
		{"a full digest's omitted firings are counted, its listed ones sent",
			&notify.Message{ID: "digest-2", ProjectID: "p1", RuleID: "r1", Digest: true, Omitted: 7, Notifications: []notify.Notification{
				firing(notify.TypeNew, "r1", "g1", 1, nil), firing(notify.TypeStormOver, "r1", "g2", 9, nil),
			}},
			[]string{`{"type":"event","payload":{"projectId":"p1","ruleId":"r1","events":[{"key":"g1","count":1,"repetitionId":null}]}}`},
			hawksender.Left{StormOver: 1, Omitted: 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tasks, left := hawksender.Tasks(tc.msg)
			if left != tc.left {
				t.Errorf("left %+v, want %+v", left, tc.left)
			}
			if len(tasks) != len(tc.want) {
				t.Fatalf("%d tasks %+v, want %d", len(tasks), tasks, len(tc.want))
			}
			for i, task := range tasks {
				got, _ := json.Marshal(task)
				if canonical(t, got) != canonical(t, []byte(tc.want[i])) {
					t.Errorf("task %d\n%s\nwant\n%s", i, got, tc.want[i])
				}
			}
		})
	}
}

type counts struct {
	mu sync.Mutex
	n  map[string]float64
}

func (c *counts) Add(channel, outcome string, n float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]float64{}
	}
	c.n[channel+"/"+outcome] += n
}

func (c *counts) get(key string) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

func publisher(t *testing.T) *queue.Publisher {
	t.Helper()
	pub, err := queue.NewPublisher(queue.PublisherConfig{URL: testenv.AMQPURL(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// What reaches Hawk's sender is in its queue once Notify returns: the
// broker confirmed it, persistent, as JSON, one task per rule of a grouped
// message with ids of their own.
func TestNotifyLeavesTheTasksInHawksSenderQueue(t *testing.T) {
	ctx := context.Background()
	pub := publisher(t)
	prefix := testenv.QueueName(t) + ".sender/"
	q := hawksender.Queue(prefix, "telegram")
	testenv.DeleteQueuesAtCleanup(t, q)
	if err := pub.Declare(ctx, q, nil); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	c := &counts{}
	ch := &hawksender.Channel{Name: "telegram", Queue: q, Publisher: pub, Counter: c,
		Log: slog.New(slog.NewJSONHandler(&logs, nil))}
	m := &notify.Message{ID: "group-1", ProjectID: "p1", Grouped: true, Notifications: []notify.Notification{
		firing(notify.TypeNew, "r1", "g1", 1, nil), firing(notify.TypeNew, "r2", "g1", 1, nil),
	}}
	retry, err := ch.Notify(ctx, "-1001234", m)
	if err != nil || retry {
		t.Fatalf("Notify: retry %v, %v", retry, err)
	}
	got := testenv.Take(t, q)
	if len(got) != 2 {
		t.Fatalf("%d tasks in %s, want 2", len(got), q)
	}
	for i, d := range got {
		var task hawksender.Task
		if err := json.Unmarshal(d.Body, &task); err != nil {
			t.Fatalf("task %s: %v", d.Body, err)
		}
		if d.ContentType != "application/json" || d.DeliveryMode != amqp.Persistent || d.MessageId != "group-1/"+string(rune('0'+i)) {
			t.Errorf("task %d: content type %q, delivery mode %d, message id %q", i, d.ContentType, d.DeliveryMode, d.MessageId)
		}
		if task.Payload.RuleID != []string{"r1", "r2"}[i] {
			t.Errorf("task %d names rule %s", i, task.Payload.RuleID)
		}
	}
	if strings.Contains(logs.String(), "-1001234") {
		t.Errorf("the endpoint reached the logs: %s", logs.String())
	}
	if n := c.get("telegram/published"); n != 2 {
		t.Errorf("counted %v published, want 2", n)
	}
}

// Until Hawk's sender (or the worker's declaration) makes its queue, a
// task has nowhere to go: that is a failure worth a retry, not a task
// dropped as Hawk's own notifier drops it.
func TestNotifyWithoutTheQueueIsRetried(t *testing.T) {
	q := hawksender.Queue(testenv.QueueName(t)+".sender/", "email")
	ch := &hawksender.Channel{Name: "email", Queue: q, Publisher: publisher(t), Log: slog.New(slog.DiscardHandler)}
	m := &notify.Message{ID: "n1", ProjectID: "p1", RuleID: "r1", Notifications: []notify.Notification{firing(notify.TypeNew, "r1", "g1", 1, nil)}}
	retry, err := ch.Notify(context.Background(), "ops@example.com", m)
	if !retry || !errors.Is(err, queue.ErrUnroutable) || !strings.Contains(err.Error(), q) {
		t.Fatalf("Notify to a missing queue: retry %v, %v; want a retry of an unroutable publish naming %s", retry, err, q)
	}
}

// A storm over publishes nothing and says so: a log line naming what was
// left out, and the count.
func TestStormOverIsLeftOutAloud(t *testing.T) {
	var logs bytes.Buffer
	c := &counts{}
	ch := &hawksender.Channel{Name: "slack", Queue: "unused", Publisher: publisher(t), Counter: c,
		Log: slog.New(slog.NewJSONHandler(&logs, nil))}
	m := &notify.Message{ID: "over-1", ProjectID: "p1", RuleID: "r1", Notifications: []notify.Notification{firing(notify.TypeStormOver, "r1", "g1", 40, nil)}}
	retry, err := ch.Notify(context.Background(), "https://hooks.slack.com/services/T/B/x", m)
	if err != nil || retry {
		t.Fatalf("Notify: retry %v, %v", retry, err)
	}
	if !strings.Contains(logs.String(), `"storm_over":1`) || !strings.Contains(logs.String(), "over-1") {
		t.Errorf("log %s: want a line naming the storm over left out", logs.String())
	}
	if n := c.get("slack/storm_over"); n != 1 {
		t.Errorf("counted %v storm_over, want 1", n)
	}
	if strings.Contains(logs.String(), "hooks.slack.com") {
		t.Errorf("the endpoint reached the logs: %s", logs.String())
	}
}

// The deliverer budgets a channel's sends by its Host, and looks up in DNS
// a host that reads as host:port: a queue name with a colon must not.
func TestHostIsTheQueueAndNoAddress(t *testing.T) {
	ch := &hawksender.Channel{Name: "email", Queue: "klaxon:test.sender/email"}
	h := ch.Host("ops@example.com")
	if _, _, err := net.SplitHostPort(h); err == nil {
		t.Errorf("Host %q reads as host:port", h)
	}
	if h != ch.Host("dev@example.com") || !strings.Contains(h, "sender/email") {
		t.Errorf("Host %q: want the queue, whatever the endpoint", h)
	}
}
