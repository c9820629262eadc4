package queue_test

import (
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

const tenMB = 10 << 20

// fillSized publishes one message per size, with ids "m<i>", in order.
func fillSized(t testing.TB, p *queue.Publisher, q string, sizes []int) {
	t.Helper()
	for i, n := range sizes {
		body := make([]byte, n)
		copy(body, fmt.Sprintf("m%d", i))
		if err := p.Publish(t.Context(), queue.Message{RoutingKey: q, MessageID: fmt.Sprintf("m%d", i), Body: body}); err != nil {
			t.Fatalf("fill %s: %v", q, err)
		}
	}
}

// drainedWithin is ledger.drainThenStop with a longer wait: 10 MB messages
// take a while through a busy broker, and a consumer that never resumes
// still fails the test.
func (l *ledger) drainedWithin(t *testing.T, r *running, n int, within time.Duration) {
	t.Helper()
	if !testenv.Eventually(within, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d after %s: consumption stopped", l.ackedCount(), n, within)
	}
	r.stop(t, 10*time.Second)
	l.exactlyOnce(t, n)
}

// heldGauge keeps the largest value Hooks.Held reported, and counts pauses.
type heldGauge struct {
	now, peak atomic.Int64
	pauses    atomic.Int64
}

func (g *heldGauge) hooks() queue.Hooks {
	return queue.Hooks{
		Held: func(b int64) {
			g.now.Store(b)
			for {
				p := g.peak.Load()
				if b <= p || g.peak.CompareAndSwap(p, b) {
					return
				}
			}
		},
		Paused: func() { g.pauses.Add(1) },
	}
}

// Messages of 10 MB and a budget under one of them: the consumer holds one
// message at a time, pausing after each and consuming again once it is
// acked. Without a byte bound (prefetch 1000), it held every message.
func TestHeldBytesStayUnderTheBudgetWithTenMegabyteMessages(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 12
	fillSized(t, pub, q, slices.Repeat([]int{tenMB}, n))

	var g heldGauge
	l := newLedger()
	release := make(chan struct{})
	_, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Prefetch: 1000, MaxBatch: 100, MaxHeldBytes: 8 << 20, Hooks: g.hooks(),
	}, func(ctx context.Context, batch *queue.Batch) error {
		select { // the first batch waits: what else arrives meanwhile is held
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	// While the first batch is in the handler, the consumer is paused with
	// that one message: the broker has the others.
	testenv.WaitFor(t, 10*time.Second, "the consumer to pause", func() bool { return g.pauses.Load() == 1 })
	b.waitReady(q, n-1, 10*time.Second)
	close(release)
	l.drainedWithin(t, r, n, 2*time.Minute)
	if p := g.peak.Load(); p > tenMB {
		t.Errorf("held up to %d bytes, want one message (%d) at most", p, tenMB)
	}
	if p := g.pauses.Load(); p < n-1 {
		t.Errorf("paused %d times, want once per message", p)
	}
	if now := g.now.Load(); now != 0 {
		t.Errorf("%d bytes still counted as held after every message was acked", now)
	}
	b.waitReady(q, 0, 5*time.Second)
}

// Small and 10 MB messages mixed at random, handled concurrently, some
// requeued once: every pause ends, every message is acked exactly once,
// and what is held stays within the budget plus what the broker had sent
// before a pause took effect.
func TestConsumptionResumesAcrossPausesWithoutLossOrDoubleAcks(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 40
	rng := mathrand.New(mathrand.NewPCG(uint64(time.Now().UnixNano()), 1))
	sizes := make([]int, n)
	for i := range sizes {
		switch rng.IntN(3) {
		case 0:
			sizes[i] = tenMB
		case 1:
			sizes[i] = 1 + rng.IntN(3<<20)
		default:
			sizes[i] = 100
		}
	}
	fillSized(t, pub, q, sizes)

	const budget = 24 << 20
	var g heldGauge
	l := newLedger()
	var mu sync.Mutex
	requeued := map[string]bool{}
	_, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Prefetch: 64, MaxBatch: 4, Concurrency: 4, MaxHeldBytes: budget, Hooks: g.hooks(),
	}, func(_ context.Context, batch *queue.Batch) error {
		mu.Lock()
		defer mu.Unlock()
		for i, d := range batch.Deliveries {
			if rng.IntN(5) == 0 && !requeued[d.MessageID] {
				requeued[d.MessageID] = true
				batch.Requeue(i)
			}
		}
		l.record(batch, func(i int) bool { return requeued[batch.Deliveries[i].MessageID] && !batch.Deliveries[i].Redelivered })
		return nil
	})
	l.drainedWithin(t, r, n, 2*time.Minute)
	// A pause takes effect once the broker has the cancel: what it sent
	// before is held too, at most the prefetch of the time, which is sized
	// so that the largest message seen fills half the budget.
	if p := g.peak.Load(); p > budget+2*tenMB {
		t.Errorf("held up to %d bytes, want at most the budget %d and two 10 MB messages", p, budget)
	}
	t.Logf("peak held %d bytes, %d pauses", g.peak.Load(), g.pauses.Load())
	b.waitReady(q, 0, 5*time.Second)
}

// The connection is cut while the consumer is paused: the new session
// starts from nothing and every message is still acked exactly once.
func TestPausedConsumerSurvivesAConnectionCut(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 6
	fillSized(t, pub, q, slices.Repeat([]int{tenMB}, n))

	px, viaProxy := newProxy(t)
	var g heldGauge
	l := newLedger()
	var first atomic.Bool
	first.Store(true)
	inHandler := make(chan struct{}, 1)
	_, r := startConsumer(t, queue.ConsumerConfig{
		URL: viaProxy, Queue: q, Prefetch: 100, MaxHeldBytes: 8 << 20, Hooks: g.hooks(),
		Backoff: queue.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
	}, func(ctx context.Context, batch *queue.Batch) error {
		if first.CompareAndSwap(true, false) {
			inHandler <- struct{}{}
			<-ctx.Done() // ends when the channel dies
			return ctx.Err()
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	receive(t, inHandler, 10*time.Second, "the first batch")
	testenv.WaitFor(t, 10*time.Second, "the consumer to pause", func() bool { return g.pauses.Load() == 1 })
	if cut := px.cut(); cut != 1 {
		t.Fatalf("cut %d connections, want 1", cut)
	}
	l.drainedWithin(t, r, n, 2*time.Minute)
	b.waitReady(q, 0, 5*time.Second)
	// The paused session's feeder ended with its channel, not only the
	// one Consume stopped.
	var stacks string
	if !testenv.Eventually(5*time.Second, func() bool {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		return !strings.Contains(stacks, "(*feeder).run")
	}) {
		t.Errorf("a feeder goroutine is left:\n%s", stacks)
	}
}

// Small messages: the prefetch grows from 1 to the configured one, so a
// byte bound costs a backlog of small messages nothing but a few
// re-consumes at the start.
func TestPrefetchGrowsWhileMessagesAreSmall(t *testing.T) {
	_, pub, q := declaredVia(t, "")
	const n = 3000
	fill(t, pub, q, n)
	var g heldGauge
	l := newLedger()
	var largest atomic.Int64
	_, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Prefetch: 1000, MaxBatch: 500, MaxHeldBytes: 64 << 20, Hooks: g.hooks(),
	}, func(_ context.Context, batch *queue.Batch) error {
		if s := int64(len(batch.Deliveries)); s > largest.Load() {
			largest.Store(s)
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	l.drainedWithin(t, r, n, 2*time.Minute)
	if largest.Load() < 100 {
		t.Errorf("largest batch %d: the prefetch did not grow", largest.Load())
	}
	if p := g.pauses.Load(); p != 0 {
		t.Errorf("%d pauses for small messages", p)
	}
}

// On a node of its own, with deploy/rabbitmq/klaxon.conf: the broker
// refuses a message over max_message_size before any worker sees it, and a
// consumer paused by the byte bound comes back after a broker restart with
// every message acked exactly once.
func TestOwnBroker(t *testing.T) {
	conf, err := os.ReadFile("../../deploy/rabbitmq/klaxon.conf")
	if err != nil {
		t.Fatal(err)
	}
	node := testenv.StartRabbitMQ(t, string(conf))
	conn, err := amqp.Dial(node.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const q = "klaxon-own-broker"
	declare := func() *amqp.Channel {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		return ch
	}

	t.Run("max_message_size refuses big messages", func(t *testing.T) {
		ch := declare()
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		err := ch.Publish("", q, false, false, amqp.Publishing{Body: make([]byte, tenMB)})
		if err == nil {
			e := receive(t, closed, 10*time.Second, "the broker to close the channel")
			err = e
		}
		if err == nil || !strings.Contains(err.Error(), "larger than configured max size") {
			t.Errorf("a 10 MB publish: %v, want the broker to refuse it", err)
		}
		ch = declare()
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		c, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{Body: make([]byte, 1<<20)})
		if err != nil || !c.Wait() {
			t.Fatalf("a 1 MB publish: %v, want it confirmed", err)
		}
		if _, err := ch.QueuePurge(q, false); err != nil {
			t.Fatal(err)
		}
	})

	// A refusal for size closes the publishing channel: Publish says so
	// with the broker's limit, so that the caller can set that message
	// aside rather than try it forever, and the next call goes through.
	t.Run("publish over max_message_size is a TooLargeError", func(t *testing.T) {
		ch := declare()
		defer func() { _, _ = ch.QueuePurge(q, false) }()
		pub, err := queue.NewPublisher(queue.PublisherConfig{URL: node.URL})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		small := queue.Message{RoutingKey: q, Body: []byte("small")}
		err = pub.Publish(t.Context(), small, queue.Message{RoutingKey: q, Body: make([]byte, 3<<20)}, small)
		tl, ok := errors.AsType[*queue.TooLargeError](err)
		if !ok || tl.Max != 2097152 || tl.Size < 3<<20 {
			t.Fatalf("Publish of a 3 MiB message = %v, want a TooLargeError with the broker's limit", err)
		}
		if err := pub.Publish(t.Context(), small); err != nil {
			t.Errorf("the next Publish: %v", err)
		}
	})

	t.Run("paused consumer survives a restart", func(t *testing.T) {
		const n, size = 6, 1536 << 10 // under the node's max_message_size
		ch := declare()
		for i := range n {
			err := ch.Publish("", q, false, false, amqp.Publishing{MessageId: fmt.Sprintf("m%d", i), DeliveryMode: amqp.Persistent, Body: make([]byte, size)})
			if err != nil {
				t.Fatal(err)
			}
		}
		var g heldGauge
		l := newLedger()
		var first atomic.Bool
		first.Store(true)
		tr := &transitions{}
		hooks := g.hooks()
		hooks.Connection = tr.hook
		_, r := startConsumer(t, queue.ConsumerConfig{
			URL: node.URL, Queue: q, Prefetch: 100, MaxHeldBytes: 1 << 20, Hooks: hooks,
			Backoff: queue.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond},
		}, func(ctx context.Context, batch *queue.Batch) error {
			if first.CompareAndSwap(true, false) {
				<-ctx.Done() // held until the broker goes
				return ctx.Err()
			}
			l.record(batch, func(int) bool { return false })
			return nil
		})
		testenv.WaitFor(t, 20*time.Second, "the consumer to pause", func() bool { return g.pauses.Load() == 1 })
		node.StopApp()
		node.StartApp()
		l.drainedWithin(t, r, n, 2*time.Minute)
		if !tr.reconnected() {
			t.Errorf("connection transitions %v, want up, down, up", tr.get())
		}
		if p := g.peak.Load(); p > size {
			t.Errorf("held up to %d bytes, want one message (%d) at most", p, size)
		}
	})
}
