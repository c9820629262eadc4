package queue

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Handler processes a batch. Returning nil settles the batch: every delivery
// is acked except those marked with Batch.Requeue. Returning an error means
// nothing in the batch was done (for example Redis is down): the Consumer
// keeps the batch, waits (Backoff) and calls the handler again with the same
// deliveries, as long as the channel lives and ctx is not cancelled.
//
// ctx is not cancelled when Consume's ctx is: the handlers in flight may
// finish during a graceful stop, for up to StopGrace. It is cancelled at once
// if the channel that delivered the batch dies, since the batch can no longer
// be acked.
//
// With ConsumerConfig.Concurrency above 1, the handler runs on several
// batches at once; each batch is still handled, retried and settled on its
// own, as described above.
type Handler func(ctx context.Context, b *Batch) error

// Batch is a run of deliveries in the order the broker sent them.
type Batch struct {
	Deliveries []Delivery
	// Attempt counts handler calls on this batch: 1, then 2 after an error, …
	Attempt int
	// ID names the batch across its attempts (a random number below 2^53),
	// so that a handler can tell its own earlier attempt's writes from
	// others' when an attempt failed after they landed.
	ID int64

	requeue []bool
	done    bool   // handled, waiting for older batches (InOrder)
	release func() // ConsumerConfig.Pipelined: lets the next batch be collected
}

// Release lets the consumer collect the next batch while this batch's
// handler goes on (ConsumerConfig.Pipelined); a no-op otherwise, and after
// the first call.
func (b *Batch) Release() {
	if b.release != nil {
		b.release()
	}
}

// Requeue marks delivery i to be nacked with requeue rather than acked when
// the handler returns nil. The broker delivers it again, to any consumer,
// with Redelivered set.
func (b *Batch) Requeue(i int) {
	if b.requeue == nil {
		b.requeue = make([]bool, len(b.Deliveries))
	}
	b.requeue[i] = true
}

// Delivery is one message as the broker delivered it.
type Delivery struct {
	Body            []byte
	MessageID       string
	ContentType     string
	ContentEncoding string
	Headers         amqp.Table
	Timestamp       time.Time
	Exchange        string
	RoutingKey      string
	// Redelivered is set when the broker delivered this message before and
	// did not get an ack for it (a crash, a lost connection, a requeue).
	Redelivered bool
	// DeliveryTag identifies the delivery on its channel; it is for logs and
	// tests, since settling goes through the Batch.
	DeliveryTag uint64
}

// Message returns the delivery as a Message for the default exchange and the
// given queue: same body, headers (copied), id and content type. It is how a
// message is passed on unchanged, e.g. to a dead-letter queue.
func (d Delivery) Message(queue string) Message {
	h := make(amqp.Table, len(d.Headers)+1)
	for k, v := range d.Headers {
		h[k] = v
	}
	return Message{
		RoutingKey:      queue,
		Body:            d.Body,
		Headers:         h,
		MessageID:       d.MessageID,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		Timestamp:       d.Timestamp,
	}
}

func fromAMQP(d amqp.Delivery) Delivery {
	return Delivery{
		Body:            d.Body,
		MessageID:       d.MessageId,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		Headers:         d.Headers,
		Timestamp:       d.Timestamp,
		Exchange:        d.Exchange,
		RoutingKey:      d.RoutingKey,
		Redelivered:     d.Redelivered,
		DeliveryTag:     d.DeliveryTag,
	}
}
