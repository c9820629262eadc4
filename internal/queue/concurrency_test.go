package queue_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// These tests use the prefetch as their witness: the broker sends no more
// than Prefetch deliveries ahead of the acks it has processed, so a handler
// that sees more than Prefetch deliveries while one batch is held proves that
// the other batches were acked meanwhile, at the broker, not only handled.

func msgIndex(id string) int {
	var k int
	_, _ = fmt.Sscanf(id, "m%d", &k)
	return k
}

func hasTag(b *queue.Batch, tag uint64) bool {
	return slices.ContainsFunc(b.Deliveries, func(d queue.Delivery) bool { return d.DeliveryTag == tag })
}

func TestConcurrencyIsChecked(t *testing.T) {
	if _, err := queue.NewConsumer(queue.ConsumerConfig{URL: "amqp://guest:guest@127.0.0.1:5672/", Queue: "q", Concurrency: -1}); err == nil {
		t.Error("NewConsumer accepted Concurrency -1")
	}
}

// A batch stuck in its handler does not stop the batches behind it from
// being handled and acked; when it finally requeues its deliveries, only
// they come back: no younger batch's ack settled them on the way (a
// multiple ack would have, and the nack of an already-acked tag would have
// closed the channel).
func TestConcurrentBatchesPassABlockedOne(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n, prefetch = 50, 10
	fill(t, pub, q, n)

	tr := &transitions{}
	l := newLedger()
	blocked := make(chan []string, 1) // the ids of the blocked batch
	release := make(chan struct{})
	var firstSeen atomic.Int64
	_, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Prefetch: prefetch, MaxBatch: 2, Concurrency: 4,
		Hooks: queue.Hooks{Connection: tr.hook},
	}, func(ctx context.Context, batch *queue.Batch) error {
		if !hasTag(batch, 1) {
			l.record(batch, func(int) bool { return false })
			return nil
		}
		if firstSeen.Add(1) > 1 {
			t.Error("the batch holding tag 1 was handled twice")
		}
		var ids []string
		for _, d := range batch.Deliveries {
			ids = append(ids, d.MessageID)
		}
		blocked <- ids
		select {
		case <-release:
		case <-ctx.Done():
			t.Errorf("blocked handler's context ended: %v", ctx.Err())
		}
		for i := range batch.Deliveries {
			batch.Requeue(i)
		}
		l.record(batch, func(int) bool { return true })
		return nil
	})
	held := receive(t, blocked, 10*time.Second, "the first batch")
	if !testenv.Eventually(15*time.Second, func() bool { return l.ackedCount() == n-len(held) }) {
		t.Fatalf("acked %d of the %d messages behind the blocked batch", l.ackedCount(), n-len(held))
	}
	close(release)
	if !testenv.Eventually(10*time.Second, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d after the release", l.ackedCount(), n)
	}
	r.stop(t, 10*time.Second)

	l.exactlyOnce(t, n)
	var redelivered []string
	for id := range l.redelivd {
		redelivered = append(redelivered, id)
	}
	slices.Sort(redelivered)
	slices.Sort(held)
	if !slices.Equal(redelivered, held) {
		t.Errorf("redelivered %v, want exactly the requeued batch %v", redelivered, held)
	}
	if got := tr.get(); !slices.Equal(got, []bool{true, false}) {
		t.Errorf("connection transitions %v, want up then down at the stop: the channel must not have failed", got)
	}
	b.waitReady(q, 0, 5*time.Second)
}

// A handler error holds and retries that batch alone, with the same
// deliveries and a growing Attempt, while the other batches go on.
func TestConcurrentHandlerErrorsRetryPerBatch(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n, prefetch = 40, 10
	fill(t, pub, q, n)

	type call struct {
		attempt int
		ids     []string
	}
	var mu sync.Mutex
	calls := map[uint64][]call{} // by the batch's first tag
	l := newLedger()
	var stuckSize atomic.Int64
	bo := queue.Backoff{Min: 10 * time.Millisecond, Max: 40 * time.Millisecond}
	_, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Prefetch: prefetch, MaxBatch: 2, Concurrency: 4, Backoff: bo,
	}, func(_ context.Context, batch *queue.Batch) error {
		var ids []string
		for _, d := range batch.Deliveries {
			if d.Redelivered {
				t.Errorf("%s redelivered: the batch should have been held, not nacked", d.MessageID)
			}
			ids = append(ids, d.MessageID)
		}
		first := batch.Deliveries[0].DeliveryTag
		mu.Lock()
		calls[first] = append(calls[first], call{batch.Attempt, ids})
		mu.Unlock()
		if first == 1 {
			// Fails until every other message is acked: held all along.
			stuckSize.Store(int64(len(ids)))
			if l.ackedCount() < n-len(ids) {
				return errBoom
			}
		} else if batch.Attempt == 1 {
			return errBoom // once
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	if !testenv.Eventually(15*time.Second, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d (the held batch holds %d)", l.ackedCount(), n, stuckSize.Load())
	}
	r.stop(t, 10*time.Second)

	l.exactlyOnce(t, n)
	mu.Lock()
	defer mu.Unlock()
	for first, cs := range calls {
		for i, c := range cs {
			if c.attempt != i+1 {
				t.Errorf("batch at tag %d: call %d has Attempt %d", first, i, c.attempt)
			}
			if !slices.Equal(c.ids, cs[0].ids) {
				t.Errorf("batch at tag %d: call %d got %v, want the same batch %v", first, i, c.ids, cs[0].ids)
			}
		}
		switch {
		case first == 1 && len(cs) < 2:
			t.Errorf("the held batch was called %d times, want retries", len(cs))
		case first != 1 && len(cs) != 2:
			t.Errorf("batch at tag %d: %d calls, want 2 (one failure, one success)", first, len(cs))
		}
	}
	if len(calls[1]) == 0 {
		t.Error("no batch started at tag 1")
	}
	b.waitReady(q, 0, 5*time.Second)
}

// A channel cut with batches in flight: what was acked before the cut never
// comes again, exactly the deliveries held in handlers come again, marked
// Redelivered, and the new channel's first batch is handled only once every
// handler of the old one has returned.
func TestConcurrentChannelCutRedeliversExactlyTheUnacked(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	// The first ackFirst messages are acked, every later batch of the first
	// channel is held. Concurrency = prefetch: every delivery the broker
	// sends reaches a handler, so the handlers see all it sent.
	const n, prefetch, ackFirst = 40, 8, 4
	fill(t, pub, q, n)

	px, viaProxy := newProxy(t)
	tr := &transitions{}
	l := newLedger()
	var mu sync.Mutex
	cut := false
	before := map[string]bool{}  // first channel: id → acked (else held)
	after := map[string][]bool{} // after the cut: id → Redelivered of each delivery
	var inHandler atomic.Int64   // first-channel handlers still running
	reup := make(chan struct{})  // closed when the consumer is up again
	var ups atomic.Int64
	_, r := startConsumer(t, queue.ConsumerConfig{
		URL: viaProxy, Queue: q, Prefetch: prefetch, MaxBatch: 2, Concurrency: prefetch,
		Backoff: queue.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Hooks: queue.Hooks{Connection: func(up bool) {
			tr.hook(up)
			if up && ups.Add(1) == 2 {
				close(reup)
			}
		}},
	}, func(ctx context.Context, batch *queue.Batch) error {
		mu.Lock()
		if cut {
			if k := inHandler.Load(); k != 0 {
				t.Errorf("the new channel's batch was handled while %d handlers of the old one ran", k)
			}
			for _, d := range batch.Deliveries {
				after[d.MessageID] = append(after[d.MessageID], d.Redelivered)
			}
			mu.Unlock()
			l.record(batch, func(int) bool { return false })
			return nil
		}
		ack := !slices.ContainsFunc(batch.Deliveries, func(d queue.Delivery) bool { return msgIndex(d.MessageID) >= ackFirst })
		for _, d := range batch.Deliveries {
			before[d.MessageID] = ack
		}
		if !ack {
			inHandler.Add(1)
		}
		mu.Unlock()
		if ack {
			l.record(batch, func(int) bool { return false })
			return nil
		}
		defer inHandler.Add(-1)
		<-ctx.Done() // ends when the channel dies
		// Go on a little after it, as a send in flight does (the deliverer
		// gives one a grace): the consumer must not reconnect meanwhile. A
		// bounded wait for something that must not happen.
		select {
		case <-reup:
			t.Error("reconnected while a handler of the old channel still ran")
		case <-time.After(300 * time.Millisecond):
		}
		return nil // claim success: the acks must not reach the new channel
	})
	// The broker has sent prefetch deliveries beyond those acked: it has
	// processed every ack, and holds exactly the others unacked.
	full := func() bool {
		mu.Lock()
		defer mu.Unlock()
		acked := 0
		for _, a := range before {
			if a {
				acked++
			}
		}
		if len(before) == prefetch+acked {
			cut = true
		}
		return cut
	}
	if !testenv.Eventually(10*time.Second, full) {
		mu.Lock()
		got := fmt.Sprint(before)
		mu.Unlock()
		t.Fatalf("the broker sent %v (id: acked), want the prefetch beyond the acked ones", got)
	}
	if k := px.cut(); k != 1 {
		t.Fatalf("cut %d connections, want 1", k)
	}
	if !testenv.Eventually(15*time.Second, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d after the cut", l.ackedCount(), n)
	}
	r.stop(t, 10*time.Second)

	l.exactlyOnce(t, n)
	if !tr.reconnected() {
		t.Errorf("transitions %v, want up, down, up", tr.get())
	}
	mu.Lock()
	defer mu.Unlock()
	held := 0
	for i := range n {
		id := fmt.Sprintf("m%d", i)
		acked, seen := before[id]
		var want []bool
		switch {
		case seen && acked: // never again
		case seen:
			held++
			want = []bool{true}
		default:
			want = []bool{false}
		}
		if !slices.Equal(after[id], want) {
			t.Errorf("%s (first channel: seen %v, acked %v): after the cut delivered with Redelivered %v, want %v",
				id, seen, acked, after[id], want)
		}
	}
	if held != prefetch {
		t.Errorf("%d deliveries held at the cut, want %d", held, prefetch)
	}
	b.waitReady(q, 0, 5*time.Second)
}

// A graceful stop lets every handler in flight finish, within StopGrace,
// settles each batch, and gives the rest back.
func TestConcurrentGracefulStopWaitsForEveryHandler(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n, slots = 50, 4
	fill(t, pub, q, n)

	type inFlight struct {
		size    int
		release chan struct{}
		ctxErr  chan error
	}
	entered := make(chan inFlight, slots)
	var calls atomic.Int64
	_, r := startConsumer(t, queue.ConsumerConfig{Queue: q, Prefetch: 20, MaxBatch: 2, Concurrency: slots},
		func(ctx context.Context, batch *queue.Batch) error {
			if calls.Add(1) > slots {
				t.Error("a batch was handed out while every slot was taken, or after the stop")
				return nil
			}
			f := inFlight{len(batch.Deliveries), make(chan struct{}), make(chan error, 1)}
			entered <- f
			<-f.release
			f.ctxErr <- ctx.Err()
			return nil
		})
	var fs []inFlight
	for range slots {
		fs = append(fs, receive(t, entered, 10*time.Second, "a batch in every slot"))
	}
	// Cancel before any release, so that no freed slot takes a new batch.
	r.cancel()
	stopped := make(chan time.Duration, 1)
	go func() { stopped <- r.stop(t, 10*time.Second) }()
	held := 0
	for i, f := range fs {
		select {
		case <-stopped:
			t.Fatalf("Consume returned with %d handlers still running", slots-i)
		default:
		}
		close(f.release)
		if err := receive(t, f.ctxErr, 5*time.Second, "handler end"); err != nil {
			t.Errorf("handler %d: context ended (%v) within the stop grace", i, err)
		}
		held += f.size
	}
	took := receive(t, stopped, 10*time.Second, "Consume to return")
	if took > 5*time.Second {
		t.Errorf("stop took %s", took)
	}
	// The finished batches are acked; the rest of the prefetch is back.
	b.waitReady(q, n-held, 5*time.Second)
}

// Batches failing together are one outage: one warning, then one
// "handler recovered" once every held batch is through, however many
// batches were held at once.
func TestConcurrentFailuresLogOneOutage(t *testing.T) {
	_, pub, q := declaredVia(t, "")
	const n, slots = 40, 4
	fill(t, pub, q, n)

	log, logs := newLogger(t)
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	failing := map[uint64]int{} // by the batch's first tag: failed attempts
	l := newLedger()
	_, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Prefetch: 20, MaxBatch: 2, Concurrency: slots, Logger: log,
		Backoff: queue.Backoff{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond},
	}, func(_ context.Context, batch *queue.Batch) error {
		if down.Load() {
			mu.Lock()
			failing[batch.Deliveries[0].DeliveryTag]++
			mu.Unlock()
			return errBoom
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	// Every slot holds a failing batch, each retried at least once.
	if !testenv.Eventually(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		retried := 0
		for _, k := range failing {
			if k >= 2 {
				retried++
			}
		}
		return retried == slots
	}) {
		t.Fatalf("not every slot held a retried batch: %v", failing)
	}
	down.Store(false)
	if !testenv.Eventually(10*time.Second, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d", l.ackedCount(), n)
	}
	r.stop(t, 10*time.Second)

	out := logs.String()
	if k := strings.Count(out, `level=WARN msg="handler failed; holding the batch to retry it"`); k != 1 {
		t.Errorf("%d warnings for %d batches held in one outage, want 1", k, slots)
	}
	if k := strings.Count(out, `msg="handler recovered"`); k != 1 {
		t.Errorf(`%d "handler recovered" for one outage, want 1`, k)
	}
}

// InOrder: batches done while an older one is still in its handler are
// not acked before it, so the broker, its prefetch full, sends nothing
// more; once the older one returns, all are settled and the rest flows,
// each message acked once.
func TestInOrderAcksWaitForTheOlderBatch(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n, prefetch = 30, 10
	fill(t, pub, q, n)

	l := newLedger()
	release := make(chan struct{})
	var younger atomic.Int64 // deliveries handled while tag 1 was held
	var holding atomic.Bool
	holding.Store(true)
	// Held reports the bytes held after each change: they grow as
	// deliveries arrive, on one goroutine, and fall only when a batch is
	// settled.
	var heldMu sync.Mutex
	var heldLast int64
	var settledEarly bool // a batch settled while tag 1 was held
	_, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Prefetch: prefetch, MaxBatch: 2, Concurrency: 4, InOrder: true,
		Hooks: queue.Hooks{Held: func(bytes int64) {
			heldMu.Lock()
			defer heldMu.Unlock()
			if bytes < heldLast && holding.Load() {
				settledEarly = true
			}
			heldLast = bytes
		}},
	}, func(ctx context.Context, batch *queue.Batch) error {
		if hasTag(batch, 1) {
			select {
			case <-release:
			case <-ctx.Done():
				t.Errorf("held handler's context ended: %v", ctx.Err())
			}
			holding.Store(false)
		} else if holding.Load() {
			younger.Add(int64(len(batch.Deliveries)))
		}
		l.record(batch, func(int) bool { return false })
		return nil
	})
	// Everything the prefetch allows beyond the held batch is handled...
	if !testenv.Eventually(10*time.Second, func() bool { return younger.Load() == prefetch-2 }) {
		t.Fatalf("handled %d deliveries behind the held batch, want %d", younger.Load(), prefetch-2)
	}
	close(release)
	if !testenv.Eventually(15*time.Second, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d after the release", l.ackedCount(), n)
	}
	// ...and none of it was settled before the held batch: an ack would
	// have freed the prefetch for more.
	heldMu.Lock()
	early := settledEarly
	heldMu.Unlock()
	if got := younger.Load(); early || got != prefetch-2 {
		t.Errorf("handled %d deliveries behind the held batch, want %d; one settled before it: %t", got, prefetch-2, early)
	}
	r.stop(t, 10*time.Second)
	l.exactlyOnce(t, n)
	if len(l.redelivd) != 0 {
		t.Errorf("redelivered %v, want none", l.redelivd)
	}
	b.waitReady(q, 0, 5*time.Second)
}

// InOrder and a graceful stop: batches done behind one given up on are
// acked, not given back with it.
func TestInOrderStopAcksTheDoneBehindAGivenUpBatch(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	const n = 6
	fill(t, pub, q, n)

	var done atomic.Int64
	_, r := startConsumer(t, queue.ConsumerConfig{
		Queue: q, Prefetch: n, MaxBatch: 2, Concurrency: 2, InOrder: true, StopGrace: 50 * time.Millisecond,
	}, func(ctx context.Context, batch *queue.Batch) error {
		if hasTag(batch, 1) {
			<-ctx.Done() // given up on when the stop grace ends
			return ctx.Err()
		}
		done.Add(int64(len(batch.Deliveries)))
		return nil
	})
	if !testenv.Eventually(10*time.Second, func() bool { return done.Load() == n-2 }) {
		t.Fatalf("handled %d deliveries behind the held batch, want %d", done.Load(), n-2)
	}
	r.stop(t, 10*time.Second)
	// Only the given-up batch is back.
	b.waitReady(q, 2, 5*time.Second)
}

// Pipelined: while the first batch has not released, no batch is collected
// behind it, though a slot is free and deliveries wait; once it released,
// the next batch is collected and handled while the first one's handler
// still runs.
func TestPipelinedCollectsOnceReleased(t *testing.T) {
	b, pub, q := declaredVia(t, "")
	batches := make(chan []string, 8)
	releaseFirst, finishFirst := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	_, _ = startConsumer(t, queue.ConsumerConfig{
		// A full batch goes at once; the linger only keeps a partial one
		// from being handed over before all five are in.
		Queue: q, Prefetch: 50, MaxBatch: 5, Concurrency: 2, Pipelined: true, Linger: 5 * time.Second,
	}, func(ctx context.Context, batch *queue.Batch) error {
		var ids []string
		for _, d := range batch.Deliveries {
			ids = append(ids, d.MessageID)
		}
		batches <- ids
		if calls.Add(1) == 1 {
			for _, wait := range []chan struct{}{releaseFirst, finishFirst} {
				select {
				case <-wait:
				case <-ctx.Done():
					return ctx.Err()
				}
				batch.Release()
			}
		}
		return nil
	})
	publish := func(ids ...string) {
		t.Helper()
		var msgs []queue.Message
		for _, id := range ids {
			msgs = append(msgs, queue.Message{RoutingKey: q, MessageID: id, Body: []byte(`{}`)})
		}
		if err := pub.Publish(t.Context(), msgs...); err != nil {
			t.Fatal(err)
		}
		b.waitReady(q, 0, 10*time.Second) // sent to the consumer
	}
	publish("a", "a1", "a2", "a3", "a4")
	if first := receive(t, batches, 10*time.Second, "the first batch"); len(first) != 5 || first[0] != "a" {
		t.Fatalf("first batch %v, want a…a4", first)
	}
	publish("b0", "b1", "b2", "b3", "b4")
	// Absence can only be watched for a while: unpipelined, the second
	// batch is handled within milliseconds of its deliveries' arrival.
	select {
	case ids := <-batches:
		t.Fatalf("batch %v handled before the first one released", ids)
	case <-time.After(300 * time.Millisecond):
	}
	close(releaseFirst)
	second := receive(t, batches, 10*time.Second, "the batch after the release, the first one's handler still running")
	if want := []string{"b0", "b1", "b2", "b3", "b4"}; !slices.Equal(second, want) {
		t.Errorf("second batch %v, want %v", second, want)
	}
	close(finishFirst)
}

// Concurrent batches are handled by Concurrency goroutines kept for the
// session, not one started per batch, whose stack would grow afresh
// through the handler's deep calls every time.
func TestConcurrentBatchesRunOnKeptHandlers(t *testing.T) {
	_, pub, q := declaredVia(t, "")
	const n, concurrency = 40, 4
	fill(t, pub, q, n)

	var mu sync.Mutex
	handlers := map[string]bool{} // goroutines that handled a batch
	var handled atomic.Int64
	startConsumer(t, queue.ConsumerConfig{Queue: q, Prefetch: 8, MaxBatch: 1, Concurrency: concurrency},
		func(context.Context, *queue.Batch) error {
			buf := make([]byte, 64)
			id, _, _ := strings.Cut(string(buf[:runtime.Stack(buf, false)]), " [") // "goroutine N"
			mu.Lock()
			handlers[id] = true
			mu.Unlock()
			handled.Add(1)
			return nil
		})
	if !testenv.Eventually(10*time.Second, func() bool { return handled.Load() >= n }) {
		t.Fatalf("%d of %d batches handled", handled.Load(), n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handlers) > concurrency {
		t.Errorf("%d batches ran on %d goroutines, want at most %d", n, len(handlers), concurrency)
	}
}
