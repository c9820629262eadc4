package evaluator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// bigRules compiles n rules of one project on one webhook, each with 20
// excluding words of 200 bytes, mostly '<': within every limit, but JSON
// writes '<' as 6 bytes, so each firing's description is 24 KB. It
// returns their ids for the counter to fire.
func bigRules(t testing.TB, n int) (*store.Snapshot, map[string]bool) {
	specs := make([]rules.Spec, n)
	fire := make(map[string]bool, n)
	for i := range specs {
		words := make([]string, 20)
		for k := range words {
			words[k] = strings.Repeat("<", 196) + fmt.Sprintf("%04d", i*20+k)
		}
		specs[i] = rules.Spec{ID: fmt.Sprintf("rule-%03d", i), IsEnabled: true, WhatToReceive: rules.OnlyNew,
			Excluding: words, Channels: webhook()}
		fire[specs[i].ID] = true
	}
	return compile(t, map[string][]rules.Spec{project: specs}), fire
}

func firingsIn(t *testing.T, msg queue.Message) []string {
	t.Helper()
	job, err := wire.DecodeJob(msg.Body)
	if err != nil {
		t.Fatal(err)
	}
	if msg.MessageID != job.Key() {
		t.Errorf("message id %q, job key %q", msg.MessageID, job.Key())
	}
	var ids []string
	for _, f := range job.Firings {
		ids = append(ids, f.Notification.ID)
	}
	return ids
}

// 100 rules sharing a webhook, firing for one event with a title of 1,000
// '<', made one grouped job of 3.2 MB: the broker refused it, and the batch
// was tried again and again while every project's events waited. The
// firings go in several jobs instead, each within wire.MaxJobBytes, each
// firing in exactly one, in the rules' order; the same batch again makes
// the same jobs with the same ids.
func TestGroupedJobOverTheBoundIsSplit(t *testing.T) {
	const n = 100
	snap, fire := bigRules(t, n)
	pub := &fakePublisher{}
	e, _ := newEvaluator(snap, &fakeCounter{fire: fire}, pub)
	batch := func() *queue.Batch {
		return &queue.Batch{ID: 3, Deliveries: []queue.Delivery{delivery(hawk(project, strings.Repeat("<", 1000), "g1", true), "m1")}}
	}
	if err := e.Handle(context.Background(), batch()); err != nil {
		t.Fatal(err)
	}
	total := 0
	var got []string
	for _, msg := range pub.msgs {
		total += len(msg.Body)
		if len(msg.Body) > wire.MaxJobBytes {
			t.Errorf("job %s of %d bytes, over %d", msg.MessageID, len(msg.Body), wire.MaxJobBytes)
		}
		if msg.RoutingKey != "k.deliveries" {
			t.Errorf("job to %q", msg.RoutingKey)
		}
		got = append(got, firingsIn(t, msg)...)
	}
	if total < 2<<20 || len(pub.msgs) < 6 {
		t.Fatalf("%d jobs of %d bytes in all: the case is not the one that was over the broker's limit", len(pub.msgs), total)
	}
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("firing-rule-%03d", i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("firings in the jobs, in order:\n%q\nwant each once:\n%q", got, want)
	}

	sameJobsAgain(t, e, pub, batch())
}

// A firing too big for any job (a rule id of 600 KB, which a rules file
// can hold) cannot be delivered: it goes to the failed queue, cut down to
// what identifies it, with the reason in its header, and is counted as
// failed. The event's other firings on the same webhook are delivered, and
// the batch is done: one message's fault is no batch error.
func TestFiringTooBigForAnyJobGoesToTheFailedQueue(t *testing.T) {
	huge := "rule-" + strings.Repeat("x", 600<<10)
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "small", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: webhook()},
		{ID: huge, IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: webhook()},
	}})
	pub := &fakePublisher{}
	e, m := newEvaluator(snap, &fakeCounter{fire: map[string]bool{"small": true, huge: true}, hashIDs: true}, pub)
	e.FailedQueue = "k.failed"
	if err := e.Handle(context.Background(), &queue.Batch{Deliveries: []queue.Delivery{
		delivery(hawk(project, "boom", "g1", true), "m1")}}); err != nil {
		t.Fatalf("Handle = %v, want the batch done", err)
	}
	var delivered, failed []queue.Message
	for _, msg := range pub.msgs {
		if len(msg.Body) > wire.MaxJobBytes {
			t.Errorf("a message of %d bytes to %s", len(msg.Body), msg.RoutingKey)
		}
		switch msg.RoutingKey {
		case "k.deliveries":
			delivered = append(delivered, msg)
		case "k.failed":
			failed = append(failed, msg)
		}
	}
	small := counter.FiringID(project, "small", "g1", time.UnixMilli(1_700_000_000_000))
	if len(delivered) != 1 || !slices.Equal(firingsIn(t, delivered[0]), []string{small}) {
		t.Errorf("delivered %d jobs, want the small rule's firing alone", len(delivered))
	}
	if len(failed) != 1 {
		t.Fatalf("%d messages in the failed queue, want the big firing", len(failed))
	}
	f := failed[0]
	reason, _ := f.Headers[wire.ErrorHeader].(string)
	if !strings.Contains(reason, "over the limit of 524288 bytes") || !strings.Contains(reason, "not sent") {
		t.Errorf("x-klaxon-error %q, want the size and the limit", reason)
	}
	if id := counter.FiringID(project, huge, "g1", time.UnixMilli(1_700_000_000_000)); f.MessageID != wire.FiringKey(id, rules.Webhook) {
		t.Errorf("failed message id %.80q", f.MessageID)
	}
	// The record's fields are those docs/contract.md §6 lists.
	var body struct {
		Channel       string               `json:"channel"`
		ProjectID     string               `json:"projectId"`
		RuleID        string               `json:"ruleId"`
		Notification  *notify.Notification `json:"notification"`
		Notifications []json.RawMessage    `json:"notifications"`
	}
	if err := json.Unmarshal(f.Body, &body); err != nil {
		t.Fatal(err)
	}
	if body.Channel != rules.Webhook || body.ProjectID != project || !strings.HasPrefix(body.RuleID, "rule-xxx") ||
		len(body.RuleID) > 256 || body.Notification == nil || body.Notification.Event.Title != "boom" || len(body.Notifications) != 1 {
		t.Errorf("failed record %.300s", f.Body)
	}
	if f.Timestamp.IsZero() {
		t.Error("the failed record has no timestamp: klaxon failed shows when it was set aside")
	}
	if got := value(t, m.Notifications.WithLabelValues(rules.Webhook, "failed")); got != 1 {
		t.Errorf("failed notifications counted %v, want 1", got)
	}
}

// tooLargePublisher is a broker with a max_message_size: it refuses a call
// that has a message over it, as RabbitMQ does, and stores the others.
type tooLargePublisher struct {
	max     int
	refused int
	msgs    []queue.Message
}

func (p *tooLargePublisher) Publish(_ context.Context, msgs ...queue.Message) error {
	for _, m := range msgs {
		if len(m.Body) > p.max {
			p.refused++
			return fmt.Errorf("2 of 9 messages unconfirmed: %w", &queue.TooLargeError{Size: len(m.Body), Max: p.max})
		}
	}
	p.msgs = append(p.msgs, msgs...)
	return nil
}

// A broker whose max_message_size is below wire.MaxJobBytes refuses a
// job within Klaxon's bound. Its refusal says its limit: the batch's jobs
// are built again within it, this batch's and the next ones', a dead
// letter over it is cut to it, saying so, and no batch fails for it.
func TestBrokerRefusalForSizeRebuildsJobsWithinItsLimit(t *testing.T) {
	const n = 30
	snap, fire := bigRules(t, n)
	pub := &tooLargePublisher{max: 100 << 10}
	e, _ := newEvaluator(snap, &fakeCounter{fire: fire}, pub)
	poison := strings.Repeat("not JSON ", 15_000) // 135 KB: dead-lettered
	for i, id := range []string{"m1", "m2"} {
		pub.msgs = nil
		if err := e.Handle(context.Background(), &queue.Batch{Deliveries: []queue.Delivery{
			delivery(hawk(project, strings.Repeat("<", 1000), "g"+id, true), id), delivery(poison, "p"+id)}}); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		got, dead := 0, 0
		for _, msg := range pub.msgs {
			if len(msg.Body) > pub.max {
				t.Errorf("batch %d: a message of %d bytes", i, len(msg.Body))
			}
			if msg.RoutingKey == "events.dead" {
				dead++
				if reason := fmt.Sprint(msg.Headers[wire.ErrorHeader]); !strings.Contains(reason, "not a JSON object") ||
					!strings.Contains(reason, fmt.Sprintf("body of %d bytes cut to the broker's max_message_size, %d", len(poison), pub.max)) {
					t.Errorf("dead letter's reason %q", reason)
				}
				continue
			}
			got += len(firingsIn(t, msg))
		}
		if got != n || dead != 1 {
			t.Errorf("batch %d: %d firings and %d dead letters published, want %d and 1", i, got, dead, n)
		}
	}
	if pub.refused != 1 {
		t.Errorf("the broker refused %d calls, want the first alone: the limit is kept", pub.refused)
	}
}

// BenchmarkHandleSplitsBigFirings is the evaluator's cost for the event
// whose 100 firings on one webhook are 3 MB of JSON, split into jobs of
// at most wire.MaxJobBytes, with a publisher that does nothing:
//
//	go test -run '^$' -bench HandleSplitsBigFirings -benchmem ./internal/evaluator
func BenchmarkHandleSplitsBigFirings(b *testing.B) {
	snap, fire := bigRules(b, 100)
	e, _ := newEvaluator(snap, &fakeCounter{fire: fire}, nopPublisher{})
	body := []byte(hawk(project, strings.Repeat("<", 1000), "g1", true))
	for b.Loop() {
		if err := e.Handle(context.Background(), &queue.Batch{Deliveries: []queue.Delivery{{Body: body, MessageID: "m1"}}}); err != nil {
			b.Fatal(err)
		}
	}
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, ...queue.Message) error { return nil }
