package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

func TestPublishReturnsOnceConfirmed(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	var hooked []queue.PublishResult
	pub := newPublisher(t, queue.PublisherConfig{Hooks: queue.Hooks{Publish: func(r queue.PublishResult) { hooked = append(hooked, r) }}})
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	msgs := make([]queue.Message, n)
	for i := range msgs {
		msgs[i] = queue.Message{RoutingKey: q, MessageID: fmt.Sprintf("m%d", i), Body: []byte("{}"),
			ContentType: "application/json", Headers: amqp.Table{"x-n": int64(i)}}
	}
	if err := pub.Publish(t.Context(), msgs...); err != nil {
		t.Fatal(err)
	}
	// Confirmed means stored: no waiting needed.
	if got := b.ready(q); got != n {
		t.Fatalf("queue holds %d right after Publish returned, want %d", got, n)
	}
	if len(hooked) != 1 || hooked[0].Messages != n || hooked[0].Err != nil {
		t.Errorf("hook got %+v", hooked)
	}

	ch := b.channel()
	defer ch.Close()
	d, ok, err := ch.Get(q, true)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if d.MessageId != "m0" || d.DeliveryMode != amqp.Persistent || d.ContentType != "application/json" || d.Headers["x-n"] != int64(0) {
		t.Errorf("got id %q mode %d type %q headers %v", d.MessageId, d.DeliveryMode, d.ContentType, d.Headers)
	}
}

func TestPublishToMissingQueueFails(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	pub := newPublisher(t, queue.PublisherConfig{})
	err := pub.Publish(t.Context(),
		queue.Message{RoutingKey: q, Body: []byte("lost?")},
		queue.Message{RoutingKey: q, Body: []byte("lost?")},
	)
	if !errors.Is(err, queue.ErrUnroutable) {
		t.Fatalf("publish to a missing queue: %v, want ErrUnroutable", err)
	}
	t.Log(err)
	// The channel stays usable.
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q}); err != nil {
		t.Fatal(err)
	}
	b.waitReady(q, 1, time.Second)
}

func TestPublishToMissingExchangeFails(t *testing.T) {
	newBroker(t)
	pub := newPublisher(t, queue.PublisherConfig{})
	err := pub.Publish(t.Context(), queue.Message{Exchange: "klaxon-test-no-such-exchange", RoutingKey: "x"})
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.NotFound {
		t.Fatalf("got %v, want the broker's 404", err)
	}
	t.Log(err)
}

func TestDeclaredQueueDeletedUnderThePublisherHeals(t *testing.T) {
	b := newBroker(t)
	q := b.queueName(".dead")
	pub := newPublisher(t, queue.PublisherConfig{})
	dead := q + ".dead"
	if err := pub.Declare(t.Context(), dead, nil); err != nil {
		t.Fatal(err)
	}
	ch := b.channel()
	if _, err := ch.QueueDelete(dead, false, false, false); err != nil {
		t.Fatal(err)
	}
	_ = ch.Close()

	msg := queue.Message{RoutingKey: dead, Body: []byte("x"), Headers: amqp.Table{"x-klaxon-error": "test"}}
	if err := pub.Publish(t.Context(), msg); !errors.Is(err, queue.ErrUnroutable) {
		t.Fatalf("first publish after the delete: %v, want ErrUnroutable", err)
	}
	if err := pub.Publish(t.Context(), msg); err != nil {
		t.Fatalf("retry: %v", err)
	}
	b.waitReady(dead, 1, time.Second)
}

func TestDeclareKeepsAQueueWithOtherArguments(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	b.declare(q, amqp.Table{"x-max-length": int32(10)})
	pub := newPublisher(t, queue.PublisherConfig{})
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatalf("declare over a queue with other args: %v", err)
	}
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q}); err != nil {
		t.Fatal(err)
	}
}

func TestDelayQueueMovesMessagesToTarget(t *testing.T) {
	b := newBroker(t)
	q := b.queueName(".retry")
	delay := q + ".retry"
	pub := newPublisher(t, queue.PublisherConfig{})
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatal(err)
	}
	if err := pub.DeclareDelay(t.Context(), delay, q, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: delay, MessageID: "later"}); err != nil {
		t.Fatal(err)
	}
	if got := b.ready(q); got != 0 {
		t.Fatalf("target holds %d at once, want 0", got)
	}
	b.waitReady(q, 1, 5*time.Second)
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("moved after %s, want ≥ 200ms", took)
	}
	if got := b.ready(delay); got != 0 {
		t.Errorf("delay queue still holds %d", got)
	}
	// A quorum queue, which dead-letters at least once: a classic one loses
	// a message that expires while the broker shuts down. The broker
	// refuses a declare of another type.
	_, err := b.channel().QueueDeclare(delay, true, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-message-ttl": int64(200), "x-dead-letter-exchange": "",
		"x-dead-letter-routing-key": q, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
	})
	if err == nil || !strings.Contains(err.Error(), "quorum") {
		t.Errorf("declaring the delay queue as classic: %v, want a refusal naming its quorum type", err)
	}
}

func TestConcurrentPublishers(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	pub := newPublisher(t, queue.PublisherConfig{MaxIdleChannels: 4})
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatal(err)
	}
	const writers, calls, per = 16, 25, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers*calls)
	for w := range writers {
		wg.Go(func() {
			for c := range calls {
				msgs := make([]queue.Message, per)
				for i := range msgs {
					msgs[i] = queue.Message{RoutingKey: q, MessageID: fmt.Sprintf("w%d-c%d-%d", w, c, i)}
				}
				if err := pub.Publish(t.Context(), msgs...); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, want := b.ready(q), writers*calls*per; got != want {
		t.Errorf("queue holds %d, want %d", got, want)
	}
}

func TestPublishFailsWhenTheConnectionDropsWhileAwaitingConfirms(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	px, viaProxy := newProxy(t)
	pub := newPublisher(t, queue.PublisherConfig{URL: viaProxy, Backoff: queue.Backoff{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}})
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q}); err != nil { // warms up a channel
		t.Fatal(err)
	}

	px.hold() // the broker stores the messages, but its confirms do not get through
	const n = 500
	msgs := make([]queue.Message, n)
	for i := range msgs {
		msgs[i] = queue.Message{RoutingKey: q}
	}
	done := make(chan error, 1)
	go func() { done <- pub.Publish(t.Context(), msgs...) }()
	b.waitReady(q, n+1, 10*time.Second) // all sent: Publish is waiting for confirms
	select {
	case err := <-done:
		t.Fatalf("Publish returned %v without confirms", err)
	default:
	}
	px.cut()
	err := receive(t, done, 10*time.Second, "Publish to return")
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.ChannelError && aerr.Code != amqp.FrameError {
		t.Fatalf("got %v, want a lost-confirms error wrapping the connection's *amqp.Error", err)
	}
	t.Log(err)
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q}); err != nil {
		t.Fatalf("publish after the cut: %v", err)
	}
}

func TestPublishFailsWhenTheConnectionDropsMidCall(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	px, viaProxy := newProxy(t)
	pub := newPublisher(t, queue.PublisherConfig{URL: viaProxy, Backoff: queue.Backoff{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}})
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q}); err != nil { // warms up a channel
		t.Fatal(err)
	}
	// Cut the connection while a large call is still sending: its first
	// messages are in the queue, and none of its confirms got through.
	px.hold()
	msgs := make([]queue.Message, 20000)
	for i := range msgs {
		msgs[i] = queue.Message{RoutingKey: q, Body: make([]byte, 512)}
	}
	done := make(chan error, 1)
	go func() { done <- pub.Publish(t.Context(), msgs...) }()
	testenv.WaitFor(t, 10*time.Second, "the first messages in the queue", func() bool { return b.ready(q) > 1 })
	px.cut()
	err := receive(t, done, 10*time.Second, "Publish to return")
	if err == nil {
		t.Fatal("Publish succeeded though the connection was cut before any of its confirms")
	}
	t.Logf("publish during the cut: %v", err)

	// The next call reconnects and succeeds.
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q, MessageID: "after"}); err != nil {
		t.Fatalf("publish after the cut: %v", err)
	}
	if !pub.Connected() {
		t.Error("Connected() = false after a successful publish")
	}
}

func TestPublishHonoursContextWhileBrokerIsUnreachable(t *testing.T) {
	px, viaProxy := newProxy(t)
	px.close() // nothing answers at that address any more
	pub := newPublisher(t, queue.PublisherConfig{URL: viaProxy})
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := pub.Publish(ctx, queue.Message{RoutingKey: "q"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want the deadline", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("returned after %s", took)
	}
	_ = pub.Close()
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: "q"}); !errors.Is(err, queue.ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

func TestDepth(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	pub := newPublisher(t, queue.PublisherConfig{})
	ctx := t.Context()
	if err := pub.Declare(ctx, q, nil); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, queue.Message{RoutingKey: q, Body: []byte("1")}, queue.Message{RoutingKey: q, Body: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	if n, err := pub.Depth(ctx, q); err != nil || n != 2 {
		t.Errorf("Depth = %d, %v; want 2", n, err)
	}
	if _, err := pub.Depth(ctx, q+".missing"); err == nil {
		t.Error("Depth of a missing queue did not fail")
	}
	// Publishing still works after the failed inspection.
	if err := pub.Publish(ctx, queue.Message{RoutingKey: q, Body: []byte("3")}); err != nil {
		t.Error(err)
	}
}

func TestDelete(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	locked := b.queueName()
	pub := newPublisher(t, queue.PublisherConfig{})
	ctx := t.Context()
	if err := pub.Declare(ctx, q, nil); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, queue.Message{RoutingKey: q, Body: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	// Exclusive to the admin connection: deleting it fails, and closes the
	// channel the delete ran on.
	ch := b.channel()
	defer ch.Close()
	if _, err := ch.QueueDeclare(locked, false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}

	err := pub.Delete(ctx, q+".missing", locked, q)
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.ResourceLocked {
		t.Errorf("Delete = %v, want the broker's 405 for %s alone", err, locked)
	}
	if got := b.ready(q); got != -1 {
		t.Errorf("queue still there after Delete, holding %d", got)
	}
	if err := pub.Delete(ctx, q+".missing"); err != nil {
		t.Errorf("Delete of a missing queue: %v", err)
	}
	// Forgotten: a publish that comes back unroutable does not declare it again.
	for range 2 {
		if err := pub.Publish(ctx, queue.Message{RoutingKey: q}); !errors.Is(err, queue.ErrUnroutable) {
			t.Fatalf("publish to the deleted queue: %v, want ErrUnroutable", err)
		}
	}
}

// A queue full with overflow reject-publish makes the broker nack: that
// message, and so the call, must not count as stored.
func TestPublishReportsANack(t *testing.T) {
	b := newBroker(t)
	q := b.queueName()
	b.declare(q, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	pub := newPublisher(t, queue.PublisherConfig{})
	err := pub.Publish(t.Context(), queue.Message{RoutingKey: q, MessageID: "fits"}, queue.Message{RoutingKey: q, MessageID: "refused"})
	if !errors.Is(err, queue.ErrNacked) {
		t.Fatalf("got %v, want ErrNacked", err)
	}
	t.Log(err)
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q}); !errors.Is(err, queue.ErrNacked) {
		t.Fatalf("on a reused channel: %v, want ErrNacked", err)
	}
	b.waitReady(q, 1, time.Second)
}
