package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// hashed sets the harness up for n hashed incoming queues and returns their
// names; the queues and the exchange are deleted when the test ends.
func (h *harness) hashed(n int) []string {
	h.t.Helper()
	h.env["KLAXON_QUEUE_SHARDS"] = fmt.Sprint(n)
	var qs []string
	for i := range n {
		qs = append(qs, wire.HashedQueue(h.queue, i))
	}
	testenv.DeleteQueuesAtCleanup(h.t, qs...)
	ex := wire.HashExchange(h.queue)
	h.t.Cleanup(func() {
		withChannel(h.t, h.amqpURL, func(ch *amqp.Channel) { _ = ch.ExchangeDelete(ex, false, false) })
	})
	return qs
}

// provision declares the exchange and binds the queues to it as an operator
// may before any worker runs (docs/scaling.md), so that the test can see
// the spread before anything is consumed. Klaxon's workers find them as
// they would declare them.
func (h *harness) provision(qs []string) {
	h.t.Helper()
	withChannel(h.t, h.amqpURL, func(ch *amqp.Channel) {
		ex := wire.HashExchange(h.queue)
		if err := ch.ExchangeDeclare(ex, "x-consistent-hash", true, false, false, false, nil); err != nil {
			h.t.Fatalf("declare %s (is rabbitmq_consistent_hash_exchange enabled? scripts/services.sh enables it): %v", ex, err)
		}
		for _, q := range qs {
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				h.t.Fatal(err)
			}
			if err := ch.QueueBind(q, "1", ex, false, nil); err != nil {
				h.t.Fatal(err)
			}
		}
	})
}

func (h *harness) publishHashed(msgs ...message) {
	h.t.Helper()
	if err := publishVia(h.amqpURL, wire.HashExchange(h.queue), "", msgs); err != nil {
		h.t.Fatal(err)
	}
}

// Events published to the exchange keyed by groupHash spread over the four
// hashed queues; Hawk's plain queue still feeds the same workers; two
// workers consuming overlapping subsets deliver every notification once.
func TestHashedQueuesNotifyOnceAcrossWorkers(t *testing.T) {
	h := newHarness(t)
	qs := h.hashed(4)
	h.provision(qs)
	newRule := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	burst := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 50, "thresholdPeriod": 3600000, "channels": h.webhookOnly()})
	project := h.project(newRule, burst)

	const groups = 40
	var msgs []message
	for i := range 3 * groups * 20 { // every group: 60 events, 3 of them "new"
		g := i % groups
		msgs = append(msgs, event(project, "boom", fmt.Sprint("g", g), i < 3*groups, fmt.Sprintf(`"repetitionId":"r%d"`, i)))
	}
	h.publishHashed(msgs...)
	total := 0
	for _, q := range qs {
		n := readyMessages(t, h.amqpURL, q)
		if n == 0 {
			t.Errorf("queue %s got none of the events: the exchange does not spread", q)
		}
		total += n
	}
	if total != len(msgs) {
		t.Fatalf("the hashed queues hold %d events, want %d", total, len(msgs))
	}
	// Hawk's grouper, unchanged: the default exchange, the plain queue.
	const hawkGroups = 5
	for g := range hawkGroups {
		h.publish(event(project, "from hawk", fmt.Sprint("hawk-", g), true))
	}

	h.env["KLAXON_QUEUES"] = strings.Join([]string{h.queue, qs[0], qs[1], qs[2]}, ",")
	a := h.start()
	h.env["KLAXON_QUEUES"] = strings.Join(qs[1:], ",")
	b := h.start()

	want := 2*groups + hawkGroups
	bodies := h.webhookBodies(want)
	ids := map[string]int{}
	for _, body := range bodies {
		ids[body["id"].(string)]++
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, want)
	if len(ids) != want {
		t.Errorf("%d distinct notification ids, want %d", len(ids), want)
	}
	for q, w := range map[string]*worker{qs[0]: a, qs[3]: b, qs[1]: a} {
		if v := w.metric(t, "klaxon_queue_consuming", "queue", q); v != 1 {
			t.Errorf("klaxon_queue_consuming{queue=%q} = %v, want 1", q, v)
		}
	}
	if _, found := b.metricOK(t, "klaxon_queue_consuming", "queue", h.queue); found {
		t.Errorf("worker b reports on %s, which it does not consume", h.queue)
	}
}

// One hashed queue that cannot be consumed (another connection holds it
// exclusively) holds up its own events only: the other queues flow, the
// worker says which queue it is not consuming, and once the queue is free
// its events come. A hashed queue deleted under the worker comes back bound
// to the exchange.
func TestOneHashedQueueRefusedOrDeleted(t *testing.T) {
	h := newHarness(t)
	qs := h.hashed(2)
	h.provision(qs)
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))

	// Block qs[1]: an exclusive consumer that takes one message and sits on it.
	holder, err := amqp.Dial(h.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	hold, err := holder.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := hold.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	held, err := hold.Consume(qs[1], "test-holder", false, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	w := h.startUnready()
	w.waitMetric(t, 30*time.Second, "consuming "+qs[0], func(v float64) bool { return v == 1 }, "klaxon_queue_consuming", "queue", qs[0])
	const groups = 40
	var msgs []message
	for g := range groups {
		msgs = append(msgs, event(project, "boom", fmt.Sprint("g", g), true))
	}
	h.publishHashed(msgs...)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatalf("none of the events went to %s", qs[1])
	}
	blocked := readyMessages(t, h.amqpURL, qs[1]) + 1 // and the one the holder sits on
	if blocked >= groups {
		t.Fatalf("%d of %d events went to %s: nothing to compare with", blocked, groups, qs[1])
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, groups-blocked)
	if v := w.metric(t, "klaxon_queue_consuming", "queue", qs[1]); v != 0 {
		t.Errorf("klaxon_queue_consuming{queue=%q} = %v while it is refused, want 0", qs[1], v)
	}
	if code, body := w.readyz(t); code != http.StatusServiceUnavailable || !strings.Contains(body, "amqp: not consuming "+qs[1]) {
		t.Errorf("/readyz = %d %q, want 503 naming %s", code, body, qs[1])
	}
	refused := false
	for _, l := range h.logs.logLines("rabbitmq unavailable") {
		refused = refused || l["queue"] == qs[1] && strings.Contains(fmt.Sprint(l["err"]), "exclusive")
	}
	if !refused {
		t.Errorf("no log line says %s is refused; logs:\n%s", qs[1], h.logs.String())
	}

	_ = hold.Close() // the held message goes back to the queue
	h.webhookBodies(groups)
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, groups)
	w.waitMetric(t, 30*time.Second, "consuming "+qs[1], func(v float64) bool { return v == 1 }, "klaxon_queue_consuming", "queue", qs[1])

	// Deleted: the worker declares it again and binds it, so events hashed
	// to it reach it (unbound, the exchange would drop them, and the other
	// queue would take them all).
	withChannel(t, h.amqpURL, func(ch *amqp.Channel) {
		if _, err := ch.QueueDelete(qs[0], false, false, false); err != nil {
			t.Fatal(err)
		}
	})
	testenv.WaitFor(t, 30*time.Second, "the deleted queue to be consumed again", func() bool {
		declared := false
		for _, l := range h.logs.logLines("declared the missing queue") {
			declared = declared || l["queue"] == qs[0]
		}
		return declared && w.metric(t, "klaxon_queue_consuming", "queue", qs[0]) == 1
	})
	cancelled := false
	for _, l := range h.logs.logLines("rabbitmq connection lost") {
		cancelled = cancelled || l["queue"] == qs[0] && strings.Contains(fmt.Sprint(l["err"]), "queue deleted?")
	}
	if !cancelled {
		t.Errorf("no log line says %s was deleted", qs[0])
	}
	if bound, ok := hasBinding(t, wire.HashExchange(h.queue), qs[0]); ok && !bound {
		t.Errorf("%s came back without its binding to the exchange", qs[0])
	}
	msgs = msgs[:0]
	for g := range groups {
		msgs = append(msgs, event(project, "boom", fmt.Sprint("again-", g), true))
	}
	h.publishHashed(msgs...)
	h.webhookBodies(2 * groups)
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 2*groups)
}

// A worker with hashed queues on a broker whose exchange of that name is
// of another type stops at start and says why.
func TestHashedQueuesNeedTheHashExchange(t *testing.T) {
	h := newHarness(t)
	h.hashed(2)
	withChannel(t, h.amqpURL, func(ch *amqp.Channel) {
		if err := ch.ExchangeDeclare(wire.HashExchange(h.queue), "direct", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	})
	env := map[string]string{"KLAXON_HTTP_ADDR": freeAddr(t)}
	for k, v := range h.env {
		env[k] = v
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	// It stops at once; a worker that did not would run until ctx ends.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = run(ctx, cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "KLAXON_QUEUE_SHARDS=2") || !strings.Contains(err.Error(), "exists with other settings") {
		t.Errorf("run = %v, want an error naming KLAXON_QUEUE_SHARDS and the exchange in the way", err)
	}
}

// hasBinding tells, through rabbitmqctl, whether exchange routes to queue;
// ok is false where rabbitmqctl cannot tell (not installed, or the broker
// is elsewhere).
func hasBinding(t testing.TB, exchange, queue string) (bound, ok bool) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		return false, false
	}
	out, err := exec.Command("rabbitmqctl", "list_bindings", "-q", "--no-table-headers",
		"source_name", "destination_name").Output()
	if err != nil {
		return false, false
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == exchange && f[1] == queue {
			return true, true
		}
	}
	return false, true
}
