package queue_test

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// ledger records what a handler saw and what it settled.
type ledger struct {
	mu       sync.Mutex
	acked    map[string]int // message id → times acked
	seen     int
	batches  []int
	redelivd map[string]bool
	changed  chan struct{}
}

func newLedger() *ledger {
	return &ledger{acked: map[string]int{}, redelivd: map[string]bool{}, changed: make(chan struct{}, 1)}
}

func (l *ledger) record(b *queue.Batch, requeued func(i int) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, len(b.Deliveries))
	for i, d := range b.Deliveries {
		l.seen++
		if d.Redelivered {
			l.redelivd[d.MessageID] = true
		}
		if !requeued(i) {
			l.acked[d.MessageID]++
		}
	}
}

func (l *ledger) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// exactlyOnce fails unless ids m0…m(n-1) were each acked once.
func (l *ledger) exactlyOnce(t *testing.T, n int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.acked) != n {
		t.Errorf("acked %d distinct messages, want %d", len(l.acked), n)
	}
	for i := range n {
		if got := l.acked[fmt.Sprintf("m%d", i)]; got != 1 {
			t.Errorf("m%d acked %d times, want 1", i, got)
		}
	}
}

func TestConsumeBatchesAndMultipleAcks(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 2000
	fill(t, pub, q, n)

	var results []queue.BatchResult
	var mu sync.Mutex
	l := newLedger()
	c, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Prefetch: 500, MaxBatch: 100,
		Hooks: queue.Hooks{Batch: func(br queue.BatchResult) { mu.Lock(); results = append(results, br); mu.Unlock() }},
	}, func(_ context.Context, batch *queue.Batch) error {
		l.record(batch, func(int) bool { return false })
		return nil
	})
	if !testenv.Eventually(10*time.Second, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d", l.ackedCount(), n)
	}
	if !c.Connected() {
		t.Error("Connected() = false while consuming")
	}
	r.stop(t, 10*time.Second)
	if c.Connected() {
		t.Error("Connected() = true after Consume returned")
	}

	l.exactlyOnce(t, n)
	if len(l.redelivd) != 0 {
		t.Errorf("%d messages marked redelivered, want none", len(l.redelivd))
	}
	if m := slices.Max(l.batches); m < 2 || m > 100 {
		t.Errorf("largest batch %d, want 2…100 (batches: %v)", m, l.batches)
	}
	mu.Lock()
	for _, br := range results {
		if br.Err != nil || br.Attempt != 1 || br.Acked != br.Size || br.Requeued != 0 {
			t.Errorf("hook got %+v", br)
		}
	}
	mu.Unlock()
	// The connection is closed: anything not acked would be back in the queue.
	b.waitReady(q, 0, 5*time.Second)
}

func TestRequeuedDeliveriesComeBackRedelivered(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 40
	fill(t, pub, q, n)

	l := newLedger()
	var mu sync.Mutex
	requeuedOnce := map[string]bool{}
	_, r := startConsumer(t, queue.ConsumerConfig{Queue: q}, func(_ context.Context, batch *queue.Batch) error {
		mu.Lock()
		defer mu.Unlock()
		var marked []int
		for i, d := range batch.Deliveries {
			var k int
			_, _ = fmt.Sscanf(d.MessageID, "m%d", &k)
			// Every third message is requeued on first sight: interleaved
			// runs of acks and nacks in one batch.
			if k%3 == 0 && !requeuedOnce[d.MessageID] {
				if d.Redelivered {
					t.Errorf("%s redelivered before it was requeued", d.MessageID)
				}
				requeuedOnce[d.MessageID] = true
				batch.Requeue(i)
				marked = append(marked, i)
			}
		}
		l.record(batch, func(i int) bool { return slices.Contains(marked, i) })
		return nil
	})
	l.drainThenStop(t, r, n)
	for i := range n {
		id := fmt.Sprintf("m%d", i)
		if want := i%3 == 0; l.redelivd[id] != want {
			t.Errorf("%s: redelivered=%v, want %v", id, l.redelivd[id], want)
		}
	}
	b.waitReady(q, 0, 5*time.Second)
}

func TestHandlerErrorRetriesTheHeldBatch(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n, failures = 30, 3
	fill(t, pub, q, n)

	type call struct {
		at      time.Time
		attempt int
		tags    []uint64
	}
	var mu sync.Mutex
	calls := map[uint64][]call{} // by the batch's first tag
	l := newLedger()
	bo := queue.Backoff{Min: 40 * time.Millisecond, Max: 200 * time.Millisecond}
	_, r := startConsumer(t, queue.ConsumerConfig{Queue: q, MaxBatch: 50, Backoff: bo}, func(_ context.Context, batch *queue.Batch) error {
		var tags []uint64
		for _, d := range batch.Deliveries {
			if d.Redelivered {
				t.Errorf("%s redelivered: the batch should have been held, not nacked", d.MessageID)
			}
			tags = append(tags, d.DeliveryTag)
		}
		mu.Lock()
		calls[tags[0]] = append(calls[tags[0]], call{time.Now(), batch.Attempt, tags})
		mu.Unlock()
		if batch.Attempt <= failures {
			return errBoom
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	l.drainThenStop(t, r, n)
	mu.Lock()
	defer mu.Unlock()
	for first, cs := range calls {
		if len(cs) != failures+1 {
			t.Errorf("batch at tag %d: %d calls, want %d", first, len(cs), failures+1)
			continue
		}
		for i, c := range cs {
			if c.attempt != i+1 {
				t.Errorf("batch at tag %d: call %d has Attempt %d", first, i, c.attempt)
			}
			if !slices.Equal(c.tags, cs[0].tags) {
				t.Errorf("batch at tag %d: call %d got tags %v, want the same batch %v", first, i, c.tags, cs[0].tags)
			}
			if i > 0 {
				// Attempt k waits at least half of min(Max, Min·2^(k-1)).
				minWait := min(bo.Max, bo.Min<<(i-1)) / 2
				if gap := c.at.Sub(cs[i-1].at); gap < minWait {
					t.Errorf("batch at tag %d: retry %d after %s, want ≥ %s", first, i, gap, minWait)
				}
			}
		}
	}
	b.waitReady(q, 0, 5*time.Second)
}

// A batch held for retries is reported while it is held, from its first
// attempt, with its attempts and last error, so that a stage that cannot
// get past one batch can say so; once the handler succeeds nothing is.
func TestOldestHoldReportsTheHeldBatch(t *testing.T) {
	_, pub, q := declaredVia(t, "")
	fill(t, pub, q, 5)
	var fail atomic.Bool
	fail.Store(true)
	l := newLedger()
	bo := queue.Backoff{Min: 20 * time.Millisecond, Max: 50 * time.Millisecond}
	start := time.Now()
	c, r := startConsumer(t, queue.ConsumerConfig{Queue: q, MaxBatch: 5, Backoff: bo}, func(_ context.Context, batch *queue.Batch) error {
		if fail.Load() {
			return errBoom
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	testenv.WaitFor(t, 10*time.Second, "a batch reported held after 3 failed attempts", func() bool { h, ok := c.OldestHold(); return ok && h.Attempts >= 3 })
	h, _ := c.OldestHold()
	if !errors.Is(h.Err, errBoom) || h.Size == 0 || h.Since.Before(start) || h.Since.After(time.Now()) {
		t.Errorf("held batch %+v", h)
	}
	fail.Store(false)
	l.drainThenStop(t, r, 5)
	if h, ok := c.OldestHold(); ok {
		t.Errorf("a batch still reported held after it succeeded: %+v", h)
	}
}

func TestGracefulStopLetsTheHandlerFinish(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 300
	fill(t, pub, q, n)

	inHandler := make(chan int, 1)
	release := make(chan struct{})
	handlerCtxErr := make(chan error, 1)
	var handlerDone atomic.Bool
	calls := 0
	_, r := startConsumer(t, queue.ConsumerConfig{Queue: q, Prefetch: 100, MaxBatch: 10}, func(ctx context.Context, batch *queue.Batch) error {
		calls++
		if calls > 1 {
			t.Error("handler called again after the stop began")
			return nil
		}
		inHandler <- len(batch.Deliveries)
		<-release
		handlerCtxErr <- ctx.Err()
		handlerDone.Store(true)
		return nil
	})
	size := receive(t, inHandler, 10*time.Second, "the first batch")

	// The handler keeps running after the cancel, until it is done:
	// whenever Consume returns, the handler must have.
	r.cancel()
	stopped := make(chan time.Duration, 1)
	go func() {
		took := r.stop(t, 10*time.Second)
		if !handlerDone.Load() {
			t.Error("Consume returned while its handler was still running")
		}
		stopped <- took
	}()
	close(release)
	if err := receive(t, handlerCtxErr, 5*time.Second, "handler end"); err != nil {
		t.Errorf("handler context ended (%v) within the stop grace", err)
	}
	took := receive(t, stopped, 10*time.Second, "Consume to return")
	t.Logf("stop took %s after the cancel", took)
	if took > 2*time.Second {
		t.Errorf("stop took %s", took)
	}
	// The finished batch is acked; the rest of the prefetch is back.
	b.waitReady(q, n-size, 5*time.Second)
}

func TestGracefulStopBoundsAStuckHandler(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 50
	fill(t, pub, q, n)

	inHandler := make(chan struct{}, 1)
	_, r := startConsumer(t, queue.ConsumerConfig{Queue: q, StopGrace: 300 * time.Millisecond}, func(ctx context.Context, batch *queue.Batch) error {
		select {
		case inHandler <- struct{}{}:
		default:
		}
		<-ctx.Done() // stuck until the grace runs out
		return ctx.Err()
	})
	receive(t, inHandler, 10*time.Second, "the first batch")
	took := r.stop(t, 5*time.Second)
	if took < 300*time.Millisecond || took > 2*time.Second {
		t.Errorf("stop took %s, want the 300ms grace and a little more", took)
	}
	b.waitReady(q, n, 5*time.Second) // nothing acked
}

func TestReconnectAfterNetworkCut(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 20
	fill(t, pub, q, n)

	px, viaProxy := newProxy(t)
	tr := &transitions{}
	l := newLedger()
	inHandler := make(chan struct{}, 1)
	firstCtxErr := make(chan error, 1)
	first := true
	c, r := startConsumer(t, queue.ConsumerConfig{
		URL: viaProxy, Queue: q, Backoff: queue.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Hooks: queue.Hooks{Connection: tr.hook},
	}, func(ctx context.Context, batch *queue.Batch) error {
		if first {
			first = false
			inHandler <- struct{}{}
			<-ctx.Done() // ends when the channel dies
			firstCtxErr <- ctx.Err()
			return nil // claim success: the acks must not reach the new channel
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	receive(t, inHandler, 10*time.Second, "the first batch")
	if cut := px.cut(); cut != 1 {
		t.Fatalf("cut %d connections, want 1", cut)
	}
	if err := receive(t, firstCtxErr, 5*time.Second, "the handler's context to end with the channel"); !errors.Is(err, context.Canceled) {
		t.Errorf("handler ctx: %v", err)
	}
	if !testenv.Eventually(15*time.Second, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d after the cut", l.ackedCount(), n)
	}
	if !tr.reconnected() || !c.Connected() {
		t.Errorf("transitions %v, connected %v; want up, down, up", tr.get(), c.Connected())
	}
	r.stop(t, 10*time.Second)

	l.exactlyOnce(t, n)
	// The batch held at the cut came back marked.
	if len(l.redelivd) == 0 {
		t.Error("no delivery marked Redelivered after the cut")
	}
	b.waitReady(q, 0, 5*time.Second)
}

func TestReconnectAfterBrokerClosesConnection(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	name := "klaxon-test-" + q
	pub := newPublisher(t, queue.PublisherConfig{ConnectionName: name + "-pub"})
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatal(err)
	}
	tr := &transitions{}
	l := newLedger()
	c, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, ConnectionName: name, Backoff: queue.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Hooks: queue.Hooks{Connection: tr.hook},
	}, func(_ context.Context, batch *queue.Batch) error {
		l.record(batch, func(int) bool { return false })
		return nil
	})
	testenv.WaitFor(t, 10*time.Second, "the consumer to connect", c.Connected)
	closeConnection(t, name)
	if !testenv.Eventually(10*time.Second, func() bool { return tr.reconnected() && c.Connected() }) {
		t.Fatalf("consumer transitions %v; want up, down, up", tr.get())
	}

	// The publisher's connection goes the same way and comes back on use.
	closeConnection(t, name+"-pub")
	testenv.WaitFor(t, 10*time.Second, "the publisher to report the connection the broker closed", func() bool { return !pub.Connected() })
	const n = 10
	fill(t, pub, q, n)
	if !testenv.Eventually(10*time.Second, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d", l.ackedCount(), n)
	}
	r.stop(t, 10*time.Second)
	l.exactlyOnce(t, n)
}

func TestConsumerRecoversWhenItsQueueIsDeleted(t *testing.T) {
	// hashed: the queue is bound to a consistent-hash exchange, and must
	// come back bound, or what is published there next is unroutable.
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashed=%t", hashed), func(t *testing.T) {
			b := newBroker(t)
			q := b.queueName()
			ex := ""
			if hashed {
				ex = b.hashExchange()
			}
			tr := &transitions{}
			l := newLedger()
			log, logs := newLogger(t)
			c, r := startConsumer(t, queue.ConsumerConfig{
				Queue: q, Exchange: ex, Logger: log,
				Backoff: queue.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
				Hooks:   queue.Hooks{Connection: tr.hook},
			}, func(_ context.Context, batch *queue.Batch) error {
				l.record(batch, func(int) bool { return false })
				return nil
			})
			testenv.WaitFor(t, 10*time.Second, "the consumer to connect", c.Connected)
			ch := b.channel()
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Fatal(err)
			}
			_ = ch.Close()
			// The broker cancels the consumer; the Consumer starts over and declares the queue again.
			if !testenv.Eventually(10*time.Second, func() bool { return tr.reconnected() && c.Connected() }) {
				t.Fatalf("transitions %v; want up, down, up", tr.get())
			}
			if b.ready(q) != 0 {
				t.Fatal("queue not declared again")
			}
			pub := newPublisher(t, queue.PublisherConfig{})
			if hashed {
				var msgs []queue.Message
				for i := range 3 {
					msgs = append(msgs, queue.Message{Exchange: ex, RoutingKey: fmt.Sprint("k", i), MessageID: fmt.Sprintf("m%d", i), Body: []byte("{}")})
				}
				if err := pub.Publish(t.Context(), msgs...); err != nil {
					t.Fatalf("publish to the exchange after the queue came back: %v", err)
				}
			} else {
				fill(t, pub, q, 3)
			}
			if !testenv.Eventually(10*time.Second, func() bool { return l.ackedCount() == 3 }) {
				t.Fatalf("acked %d of 3", l.ackedCount())
			}
			r.stop(t, 10*time.Second)
			for _, want := range []string{"broker cancelled consumer", "declared the missing queue"} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("log lacks %q", want)
				}
			}
		})
	}
}

// The incoming queue may exist already, made by Hawk (classic, no
// arguments), by an operator (a quorum queue, or with a length limit) or by
// another Klaxon with another KLAXON_QUEUE_TYPE. A queue's type cannot
// change, and a declaration that differs fails with PRECONDITION_FAILED:
// the consumer uses whatever exists as it is, without declaring it again
// and without a warning, since nothing is wrong.
func TestConsumerUsesAnExistingQueueAsItIs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing amqp.Table
		want     queue.Type
		isType   queue.Type
	}{
		{"classic with a length limit, classic wanted", amqp.Table{"x-max-length": int32(1000)}, queue.Classic, queue.Classic},
		{"classic, quorum wanted", nil, queue.Quorum, queue.Classic},
		{"quorum, classic wanted", amqp.Table{"x-queue-type": "quorum"}, queue.Classic, queue.Quorum},
		{"quorum, quorum wanted", amqp.Table{"x-queue-type": "quorum"}, queue.Quorum, queue.Quorum},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBroker(t)
			q := b.queueName()
			b.declare(q, tc.existing)
			pub := newPublisher(t, queue.PublisherConfig{})
			fill(t, pub, q, 5)

			log, logs := newLogger(t)
			l := newLedger()
			_, r := startConsumer(t, queue.ConsumerConfig{Queue: q, QueueType: tc.want, Logger: log},
				func(_ context.Context, batch *queue.Batch) error {
					l.record(batch, func(int) bool { return false })
					return nil
				})
			if !testenv.Eventually(10*time.Second, func() bool { return l.ackedCount() == 5 }) {
				t.Fatalf("acked %d of 5", l.ackedCount())
			}
			r.stop(t, 10*time.Second)
			if out := logs.String(); strings.Contains(out, "level=WARN") {
				t.Errorf("warned about a queue it only uses:\n%s", out)
			}
			if got := b.queueType(q, tc.existing); got != tc.isType {
				t.Errorf("queue is %s now, want it still %s", got, tc.isType)
			}
		})
	}
}

// A missing queue is made with the type asked for.
func TestConsumerCreatesAMissingQueueOfItsType(t *testing.T) {
	for _, typ := range []queue.Type{"", queue.Classic, queue.Quorum} {
		t.Run(string(typ), func(t *testing.T) {
			b := newBroker(t)
			q := b.queueName()
			pub := newPublisher(t, queue.PublisherConfig{})
			l := newLedger()
			c, r := startConsumer(t, queue.ConsumerConfig{Queue: q, QueueType: typ},
				func(_ context.Context, batch *queue.Batch) error {
					l.record(batch, func(int) bool { return false })
					return nil
				})
			testenv.WaitFor(t, 10*time.Second, "the consumer to connect", c.Connected)
			fill(t, pub, q, 3)
			if !testenv.Eventually(10*time.Second, func() bool { return l.ackedCount() == 3 }) {
				t.Fatalf("acked %d of 3", l.ackedCount())
			}
			r.stop(t, 10*time.Second)
			want := typ
			if want == "" {
				want = queue.Classic
			}
			if got := b.queueType(q, nil); got != want {
				t.Errorf("made a %s queue, want %s", got, want)
			}
		})
	}
}

func TestUnreachableBrokerIsLoggedOnceWithoutCredentials(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	// A broker that hangs up on every connection, counting the attempts.
	var attempts atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			attempts.Add(1)
			_ = conn.Close()
		}
	}()
	addr := ln.Addr().String()

	log, logs := newLogger(t)
	_, r := startConsumer(t, queue.ConsumerConfig{
		URL: "amqp://klaxon:s3cr3t-pw@" + addr + "/", Queue: "nope", Logger: log,
		Backoff: queue.Backoff{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond},
	}, func(context.Context, *queue.Batch) error { return nil })
	testenv.WaitFor(t, 5*time.Second, "the failure logged", func() bool { return strings.Contains(logs.String(), "rabbitmq unavailable") })
	first := attempts.Load()
	if !testenv.Eventually(5*time.Second, func() bool { return attempts.Load() >= first+5 }) {
		t.Fatalf("%d connection attempts, want at least %d", attempts.Load(), first+5)
	}
	r.stop(t, 5*time.Second)

	out := logs.String()
	if n := strings.Count(out, "rabbitmq unavailable"); n != 1 {
		t.Errorf("logged the same failure %d times, want once", n)
	}
	if strings.Contains(out, "s3cr3t-pw") {
		t.Errorf("password in the logs:\n%s", out)
	}
	if !strings.Contains(out, "url=amqp://"+addr+"/ ") {
		t.Errorf("logs do not name the URL without its user info:\n%s", out)
	}
	if strings.Contains(out, "klaxon:") || strings.Contains(out, "@"+addr) {
		t.Errorf("user info in the logs:\n%s", out)
	}

	_, err = queue.NewConsumer(queue.ConsumerConfig{URL: "amqp://u:s3cr3t-pw@host:port/", Queue: "q"})
	if err == nil || strings.Contains(err.Error(), "s3cr3t-pw") {
		t.Errorf("invalid URL error %q: want an error without the password", err)
	}
}

func TestNoGoroutinesLeftAfterReconnects(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	before := runtime.NumGoroutine()

	func() {
		px, viaProxy := newProxy(t)
		pub, err := queue.NewPublisher(queue.PublisherConfig{URL: viaProxy, Backoff: queue.Backoff{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		if err := pub.Declare(t.Context(), q, nil); err != nil {
			t.Fatal(err)
		}
		l := newLedger()
		c, r := startConsumer(t, queue.ConsumerConfig{URL: viaProxy, Queue: q, Backoff: queue.Backoff{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}},
			func(_ context.Context, batch *queue.Batch) error {
				l.record(batch, func(int) bool { return false })
				return nil
			})
		for round := range 3 {
			testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("the consumer to connect in round %d", round), c.Connected)
			if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q, MessageID: fmt.Sprintf("m%d", round)}); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("round %d's message consumed", round), func() bool { return l.ackedCount() == round+1 })
			px.cut()
			testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("round %d's cut noticed", round), func() bool { return !c.Connected() || !pub.Connected() })
		}
		r.stop(t, 10*time.Second)
		_ = pub.Close()
		px.close()
	}()

	var after int
	if !testenv.Eventually(5*time.Second, func() bool { after = runtime.NumGoroutine(); return after <= before }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before, %d after:\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// A failed attempt did nothing, its Requeue marks included: the next
// attempt starts with none, and the batch is acked when it succeeds.
func TestRequeueMarksOfAFailedAttemptAreDropped(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 10
	fill(t, pub, q, n)

	var mu sync.Mutex
	var results []queue.BatchResult
	l := newLedger()
	_, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Backoff: queue.Backoff{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond},
		Hooks: queue.Hooks{Batch: func(br queue.BatchResult) { mu.Lock(); results = append(results, br); mu.Unlock() }},
	}, func(_ context.Context, batch *queue.Batch) error {
		if batch.Attempt == 1 {
			for i := range batch.Deliveries {
				batch.Requeue(i)
			}
			return errBoom
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	l.drainThenStop(t, r, n)
	if len(l.redelivd) != 0 {
		t.Errorf("%d messages came back redelivered: a failed attempt's marks requeued them", len(l.redelivd))
	}
	mu.Lock()
	for _, br := range results {
		if br.Err == nil && (br.Requeued != 0 || br.Acked != br.Size) {
			t.Errorf("hook got %+v, want every delivery acked", br)
		}
	}
	mu.Unlock()
	b.waitReady(q, 0, 5*time.Second)
}

// A trickle of deliveries, each arriving within Linger of the one before,
// does not hold a batch open: Linger counts from the batch's first wait, not
// from each arrival.
func TestLingerBoundsABatchUnderATrickle(t *testing.T) {
	_, pub, q := declaredVia(t, "")
	const n, linger, gap = 60, 100 * time.Millisecond, 10 * time.Millisecond
	l := newLedger()
	_, r := startConsumer(t, queue.ConsumerConfig{Queue: q, MaxBatch: 1000, Linger: linger},
		func(_ context.Context, batch *queue.Batch) error {
			l.record(batch, func(int) bool { return false })
			return nil
		})
	start := time.Now()
	for i := range n {
		if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q, MessageID: fmt.Sprintf("m%d", i)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(gap) // the trickle itself, not a wait for anything
	}
	took := time.Since(start)
	l.drainThenStop(t, r, n)
	l.mu.Lock()
	defer l.mu.Unlock()
	// Each batch closes at most linger after its first wait: a trickle over
	// took needs about took/linger of them. Half that leaves room for a slow
	// machine; a linger restarted by every arrival makes one or two.
	if want := int(took / linger / 2); len(l.batches) < want {
		t.Errorf("%d messages over %s came in %d batches %v, want at least %d with a %s linger",
			n, took.Round(time.Millisecond), len(l.batches), l.batches, want, linger)
	}
}

// A batch holds every delivery ready when it is collected: what arrived
// while the batch before was in the handler is handled together, without
// a linger. Handed over one at a time, the collector would see only the
// delivery being offered at that instant, and close a batch of one or two.
func TestABatchHoldsEveryDeliveryReady(t *testing.T) {
	for _, budget := range []int64{0, 1 << 20} { // no feeder's budget, and one
		t.Run(fmt.Sprintf("MaxHeldBytes=%d", budget), func(t *testing.T) {
			_, pub, q := declaredVia(t, "")
			const n = 50
			var held atomic.Int64
			first, release := make(chan struct{}), make(chan struct{})
			var mu sync.Mutex
			var sizes []int
			_, r := startConsumer(t, queue.ConsumerConfig{
				Queue: q, MaxBatch: 1000, Linger: -1, MaxHeldBytes: budget,
				Hooks: queue.Hooks{Held: func(b int64) { held.Store(b) }},
			}, func(_ context.Context, b *queue.Batch) error {
				mu.Lock()
				sizes = append(sizes, len(b.Deliveries))
				k := len(sizes)
				mu.Unlock()
				if k == 1 {
					close(first)
					<-release
				}
				return nil
			})
			msg := func(id string) queue.Message {
				return queue.Message{RoutingKey: q, MessageID: id, Body: []byte("0123456789")}
			}
			if err := pub.Publish(t.Context(), msg("first")); err != nil {
				t.Fatal(err)
			}
			receive(t, first, 10*time.Second, "the first batch")
			for i := range n {
				if err := pub.Publish(t.Context(), msg(fmt.Sprint(i))); err != nil {
					t.Fatal(err)
				}
			}
			// All n are in the worker (the slow start of a budget included)
			// before the first batch is let go.
			if !testenv.Eventually(10*time.Second, func() bool { return held.Load() == (n+1)*10 }) {
				t.Fatalf("the worker holds %d bytes, want %d", held.Load(), (n+1)*10)
			}
			close(release)
			testenv.WaitFor(t, 10*time.Second, "a second batch", func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) >= 2 })
			r.stop(t, 10*time.Second)
			mu.Lock()
			defer mu.Unlock()
			if sizes[1] != n {
				t.Errorf("batches of %v: the second holds %d of the %d deliveries waiting, want all", sizes, sizes[1], n)
			}
		})
	}
}

// A graceful stop gives a held batch back once, after cancelling the
// consumer. Given back before, the broker delivers it straight back to the
// consumer that is stopping, which gives it back a second time: two
// deliveries counted against a quorum queue's delivery-limit for one.
func TestGracefulStopGivesAHeldBatchBackOnce(t *testing.T) {
	for _, conc := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency=%d", conc), func(t *testing.T) {
			b := newBroker(t)
			q := b.queueName()
			// Quorum queues count every return in x-delivery-count.
			args := amqp.Table{"x-queue-type": "quorum"}
			pub := newPublisher(t, queue.PublisherConfig{})
			if err := pub.Declare(t.Context(), q, args); err != nil {
				t.Skipf("no quorum queue on this broker: %v", err)
			}
			const n = 8
			fill(t, pub, q, n)

			held := make(chan struct{}, n)
			_, r := startConsumer(t, queue.ConsumerConfig{
				Queue: q, QueueArgs: args, Prefetch: 100, MaxBatch: 2, Concurrency: conc,
				Backoff: queue.Backoff{Min: time.Minute, Max: time.Minute},
			}, func(_ context.Context, batch *queue.Batch) error {
				if batch.Attempt == 1 {
					held <- struct{}{}
				}
				return errBoom // held, waiting a minute for its retry
			})
			for range conc {
				receive(t, held, 10*time.Second, "a held batch in every slot")
			}
			r.stop(t, 10*time.Second)

			ch := b.channel()
			defer ch.Close()
			for range n {
				m, ok, err := ch.Get(q, true)
				if err != nil || !ok {
					t.Fatalf("get: %v, %v", ok, err)
				}
				// Delivered once, given back once.
				if k, _ := m.Headers["x-delivery-count"].(int64); k != 1 {
					t.Errorf("%s: x-delivery-count %v, want 1", m.MessageId, m.Headers["x-delivery-count"])
				}
			}
		})
	}
}
