package main

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// One project floods new groups, each firing an ONLY_NEW rule. Its
// notifications travel in the bulk lane: once the flood is counted,
// another project's new error is sent within fairBound while the flood's
// are still being sent. Before it is counted, the events behind it in one
// incoming queue wait for it (the broker's line: docs/guarantees.md says
// how long); with hashed incoming queues keyed by project, another
// project's events are not behind it at all.
func TestFairnessNewGroupFlood(t *testing.T) {
	tries := fairTries(t)
	chans := victimChannels{"webhook", "slack", "telegram", "email"}
	flood := func(h *harness, n int) (string, []message, *provider) {
		t.Helper()
		sink := newProvider(t, answer)
		url := sink.listen(t, "127.0.0.1:0") + "/flood"
		id := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW",
			"channels": bson.M{"webhook": bson.M{"isEnabled": true, "endpoint": url, "minPeriod": 0}}}))
		var msgs []message
		for i := range n {
			m := event(id, "Error: one of a flood of new errors", fmt.Sprintf("flood-%d", i), true)
			m.Key = id
			msgs = append(msgs, m)
		}
		return id, msgs, sink
	}

	t.Run("one queue, the flood counted", func(t *testing.T) {
		h := newHarness(t)
		victim := h.project(h.victimRule(chans))
		// Sent at a few hundred a second under -race: the victim's
		// tries fall while they are.
		const n = 2_000
		_, msgs, sink := flood(h, n)
		w := h.start()
		h.publish(msgs...)
		w.waitMetric(t, 3*time.Minute, "the flood counted", func(v float64) bool { return v >= n },
			"klaxon_events_total", "outcome", "counted")
		if sent, _ := sink.delivered(); sent >= n {
			t.Fatalf("the flood's %d notifications were all sent before the victim's first: nothing left to measure", sent)
		}
		h.victimArrives(w, victim, chans, tries)
		sent, _ := sink.delivered()
		t.Logf("%d of the flood's %d notifications sent by the victim's last", sent, n)
		testenv.WaitFor(t, 3*time.Minute, "every notification of the flood", func() bool { sent, _ := sink.delivered(); return sent >= n })
		if _, byID := sink.delivered(); len(byID) != n {
			t.Errorf("the flood's notifications went to %d ids, want %d, each once", len(byID), n)
		}
	})

	t.Run("queues keyed by project", func(t *testing.T) {
		h := newHarness(t)
		qs := h.hashed(2)
		h.provision(qs)
		// A threshold it never reaches: the flood costs counting alone.
		id := h.project(rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 1000, "thresholdPeriod": 3600000, "channels": h.webhookOnly()}))
		victim := h.project(h.victimRule(chans))
		for h.shardOf(qs, victim) == h.shardOf(qs, id) {
			victim = h.project(h.victimRule(chans))
		}
		floodQueue := h.shardOf(qs, id)
		var msgs []message
		for i := range 25_000 * tries {
			m := event(id, "Error: one of a flood of new errors", fmt.Sprintf("flood-%d", i), true)
			m.Key = id
			msgs = append(msgs, m)
		}
		h.publishHashed(msgs...)
		w := h.start()
		h.victimArrivesVia(w, victim, chans, tries, func(m message) { h.publishHashed(m) })
		waiting := readyMessages(t, h.amqpURL, floodQueue)
		t.Logf("%d of the flood's %d events still waiting in %s at the victim's last", waiting, len(msgs), floodQueue)
		if waiting == 0 {
			t.Errorf("the flood was all taken before the victim's last notification: the test shows nothing; make it larger")
		}
	})
}

// shardOf is the hashed queue of qs that an event keyed by key goes to: a
// probe published through the exchange, then purged.
func (h *harness) shardOf(qs []string, key string) string {
	h.t.Helper()
	h.publishHashed(message{Body: "{}", Key: key})
	shard := ""
	withChannel(h.t, h.amqpURL, func(ch *amqp.Channel) {
		for _, q := range qs {
			n, err := ch.QueuePurge(q, false)
			if err != nil {
				h.t.Fatal(err)
			}
			if n > 0 {
				shard = q
			}
		}
	})
	if shard == "" {
		h.t.Fatalf("a probe keyed %s reached none of %v", key, qs)
	}
	return shard
}
