package queue_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
)

// `.dead` and `.failed` kept 600 MB of one project's poison: bounded, they
// drop their oldest messages and keep the newest, which are the ones an
// operator investigates.
//
// Quorum queues honour the same bounds and drop-head overflow (RabbitMQ
// 3.10), so `.dead` and `.failed` may be either type.
func TestBoundedQueueKeepsTheNewest(t *testing.T) {
	for _, typ := range []queue.Type{queue.Classic, queue.Quorum} {
		t.Run(string(typ), func(t *testing.T) { testBoundedQueueKeepsTheNewest(t, typ) })
	}
}

func testBoundedQueueKeepsTheNewest(t *testing.T, typ queue.Type) {
	b := newBroker(t)
	pub := newPublisher(t, queue.PublisherConfig{QueueType: typ})
	q := b.queueName()
	if err := pub.Declare(t.Context(), q, queue.Bounds{MaxMessages: 5}.Args()); err != nil {
		t.Fatal(err)
	}
	fill(t, pub, q, 8) // confirmed: the broker applied the bound to each
	b.waitReady(q, 5, 5*time.Second)
	ch := b.channel()
	defer ch.Close()
	var ids []string
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		ids = append(ids, d.MessageId)
	}
	if got := strings.Join(ids, ","); got != "m3,m4,m5,m6,m7" {
		t.Errorf("queue kept %s, want the 5 newest m3..m7", got)
	}
	if got := b.queueType(q, queue.Bounds{MaxMessages: 5}.Args()); got != typ {
		t.Errorf("made a %s queue, want %s", got, typ)
	}
}

// The byte bound holds whatever the count.
func TestBoundedQueueByBytes(t *testing.T) {
	for _, typ := range []queue.Type{queue.Classic, queue.Quorum} {
		t.Run(string(typ), func(t *testing.T) { testBoundedQueueByBytes(t, typ) })
	}
}

func testBoundedQueueByBytes(t *testing.T, typ queue.Type) {
	b := newBroker(t)
	pub := newPublisher(t, queue.PublisherConfig{QueueType: typ})
	q := b.queueName()
	if err := pub.Declare(t.Context(), q, queue.Bounds{MaxBytes: 1000}.Args()); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		body := []byte(strings.Repeat("x", 300))
		if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q, MessageID: fmt.Sprint(i), Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	b.waitReady(q, 3, 5*time.Second) // 3 × 300 bytes fit in 1000
}

// A dead-letter queue an earlier Klaxon made has no bounds, and the broker
// refuses to redeclare it with them (PRECONDITION_FAILED). Klaxon keeps
// using it and says, at start-up, how the operator bounds it.
func TestUnboundedQueueFromAnEarlierKlaxonIsKeptWithAdvice(t *testing.T) {
	b := newBroker(t)
	log, logs := newLogger(t)
	pub := newPublisher(t, queue.PublisherConfig{Logger: log})
	q := b.queueName()
	b.declare(q, nil) // as an earlier Klaxon made it
	if err := pub.Declare(t.Context(), q, queue.Bounds{MaxMessages: 100_000, MaxBytes: 256 << 20}.Args()); err != nil {
		t.Fatalf("declare over the unbounded queue: %v, want it kept", err)
	}
	fill(t, pub, q, 2)
	b.waitReady(q, 2, 5*time.Second)
	out := logs.String()
	for _, want := range []string{"level=WARN", q, "rabbitmqctl set_policy", "max-length", "100000", "268435456", "drop-head"} {
		if !strings.Contains(out, want) {
			t.Errorf("start-up warning lacks %q:\n%s", want, out)
		}
	}
}

// With KLAXON_QUEUE_TYPE=quorum, a `.dead` or `.failed` queue an earlier
// Klaxon made classic keeps working, and the warning says that its type
// cannot change and how to change it, not how to bound it.
func TestClassicQueueIsKeptWhenQuorumIsWanted(t *testing.T) {
	b := newBroker(t)
	log, logs := newLogger(t)
	pub := newPublisher(t, queue.PublisherConfig{Logger: log, QueueType: queue.Quorum})
	q := b.queueName()
	b.declare(q, nil)
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatalf("declare over the classic queue: %v, want it kept", err)
	}
	fill(t, pub, q, 2)
	b.waitReady(q, 2, 5*time.Second)
	if got := b.queueType(q, nil); got != queue.Classic {
		t.Errorf("queue is %s, want it still classic", got)
	}
	out := logs.String()
	for _, want := range []string{"level=WARN", "type cannot change", "KLAXON_QUEUE_TYPE"} {
		if !strings.Contains(out, want) {
			t.Errorf("warning lacks %q:\n%s", want, out)
		}
	}
}
