package queue_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// hashExchange returns a unique exchange name, deleted when the test ends.
// The broker must have the consistent-hash exchange (scripts/services.sh
// enables its plugin).
func (b *broker) hashExchange() string {
	b.t.Helper()
	name := fmt.Sprintf("klaxon-test-%s-%s.hash", strings.ReplaceAll(b.t.Name(), "/", "-"), rand.Text()[:8])
	b.t.Cleanup(func() {
		ch, err := b.conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		_ = ch.ExchangeDelete(name, false, false)
	})
	return name
}

// byQueue records which queue consumed each message, by routing key.
type byQueue struct {
	mu    sync.Mutex
	acked map[string][]string // message id → queues that acked it
	keys  map[string]map[string]bool
}

func newByQueue() *byQueue {
	return &byQueue{acked: map[string][]string{}, keys: map[string]map[string]bool{}}
}

func (r *byQueue) handler(q string) queue.Handler {
	return func(_ context.Context, b *queue.Batch) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, d := range b.Deliveries {
			r.acked[d.MessageID] = append(r.acked[d.MessageID], q)
			if r.keys[d.RoutingKey] == nil {
				r.keys[d.RoutingKey] = map[string]bool{}
			}
			r.keys[d.RoutingKey][q] = true
		}
		return nil
	}
}

func (r *byQueue) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

// Messages published to the exchange with a key (Klaxon: the groupHash)
// spread over the bound queues, each key to one queue, each message
// consumed once.
func TestHashExchangeSpreadsKeysOverQueues(t *testing.T) {
	b := newBroker(t)
	ex := b.hashExchange()
	const queues, keys, perKey = 4, 40, 10
	rec := newByQueue()
	var cs []*queue.Consumer
	for range queues {
		q := b.queueName()
		c, _ := startConsumer(t, queue.ConsumerConfig{Queue: q, Exchange: ex, Prefetch: 50}, rec.handler(q))
		cs = append(cs, c)
	}
	for _, c := range cs {
		testenv.WaitFor(t, 10*time.Second, "every consumer to connect", c.Connected)
	}
	pub := newPublisher(t, queue.PublisherConfig{})
	var msgs []queue.Message
	for i := range keys * perKey {
		key := fmt.Sprintf("group-%d", i%keys)
		msgs = append(msgs, queue.Message{Exchange: ex, RoutingKey: key, MessageID: fmt.Sprintf("m%d", i), Body: []byte("{}")})
	}
	if err := pub.Publish(t.Context(), msgs...); err != nil {
		t.Fatalf("publish through %s: %v", ex, err)
	}
	if !testenv.Eventually(20*time.Second, func() bool { return rec.count() == keys*perKey }) {
		t.Fatalf("consumed %d of %d", rec.count(), keys*perKey)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for id, qs := range rec.acked {
		if len(qs) != 1 {
			t.Errorf("%s consumed %d times, from %v", id, len(qs), qs)
		}
	}
	used := map[string]int{}
	for key, qs := range rec.keys {
		if len(qs) != 1 {
			t.Errorf("key %s went to %d queues, want 1", key, len(qs))
		}
		for q := range qs {
			used[q]++
		}
	}
	if len(used) != queues {
		t.Errorf("%d of %d queues got keys (%v): the exchange does not spread", len(used), queues, used)
	}
}

// A worker fails at start, saying what to enable, when the broker lacks
// the exchange; DeclareHashExchange is idempotent otherwise.
func TestDeclareHashExchange(t *testing.T) {
	b := newBroker(t)
	ex := b.hashExchange()
	pub := newPublisher(t, queue.PublisherConfig{})
	for range 2 {
		if err := pub.DeclareHashExchange(t.Context(), ex); err != nil {
			t.Fatal(err)
		}
	}
	// Of another type already: a clear error, and the publisher still works.
	other := b.hashExchange()
	ch := b.channel()
	if err := ch.ExchangeDeclare(other, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_ = ch.Close()
	err := pub.DeclareHashExchange(t.Context(), other)
	if err == nil || !strings.Contains(err.Error(), "exists with other settings") {
		t.Errorf("declare over a direct exchange: %v, want it to say the exchange exists with other settings", err)
	}
	q := b.queueName()
	b.declare(q, nil)
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q, Body: []byte("{}")}); err != nil {
		t.Errorf("publish after the failed declare: %v", err)
	}
}
