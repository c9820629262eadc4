package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/tools/internal/rabbit"
)

// broker is the bench's own access to RabbitMQ: the Publisher declares,
// fills and deletes queues; the plain connection does what a Publisher does
// not (consume, purge, publish paced without waiting for confirms, poll
// depths).
type broker struct{ *rabbit.Broker }

// amqpPort is the TCP port of the broker at url (amqp091's defaults when
// it names none), 0 when url does not parse: how the bench tells its broker
// from another node on the same host.
func amqpPort(url string) uint64 {
	u, err := amqp.ParseURI(url)
	if err != nil {
		return 0
	}
	return uint64(u.Port)
}

// The queues it declares are of type typ.
func dialBroker(url string, typ queue.Type) (*broker, error) {
	b, err := rabbit.Dial(url, "klaxon-bench", typ)
	if err != nil {
		return nil, err
	}
	return &broker{b}, nil
}

// version is RabbitMQ's version as it announced it.
func (b *broker) version() string {
	v, _ := b.Conn.Properties["version"].(string)
	return v
}

// ready is how many messages the queue holds ready. The bench polls it every
// 20 ms while it measures (Inspect keeps one channel for it).
func (b *broker) ready(name string) (int, error) {
	q, err := b.Inspect(name)
	return q.Messages, err
}

// purge empties a queue.
func (b *broker) purge(name string) error {
	ch, err := b.Conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueuePurge(name, false); err != nil {
		return fmt.Errorf("purge %s: %w", name, err)
	}
	return nil
}

// fill publishes n messages made by msg, persistent, and returns once
// every one is confirmed. It publishes window at a time (2000 for events;
// 1 for big messages, which the broker should take one by one): done counts
// confirmed messages for the progress bar.
func (b *broker) fill(ctx context.Context, n, window int, msg func(i int) queue.Message, done *atomic.Int64) error {
	msgs := make([]queue.Message, 0, window)
	for i := 0; i < n; i += window {
		msgs = msgs[:0]
		for j := i; j < min(i+window, n); j++ {
			msgs = append(msgs, msg(j))
		}
		if err := b.Publish(ctx, msgs...); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
		done.Add(int64(len(msgs)))
	}
	return nil
}

// hashed declares the consistent-hash exchange and the queues bound to it
// with weight 1, as the workers would (KLAXON_QUEUE_SHARDS).
func (b *broker) hashed(ctx context.Context, exchange string, queues []string, args amqp.Table) error {
	if err := b.DeclareHashExchange(ctx, exchange); err != nil {
		return err
	}
	ch, err := b.Conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	for _, q := range queues {
		if err := b.Declare(ctx, q, args); err != nil {
			return err
		}
		if err := ch.QueueBind(q, "1", exchange, false, nil); err != nil {
			return fmt.Errorf("bind %s to %s: %w", q, exchange, err)
		}
	}
	return nil
}

// deleteExchanges deletes exchanges; one that does not exist is no error.
func (b *broker) deleteExchanges(names ...string) error {
	var errs []error
	for _, name := range names {
		ch, err := b.Conn.Channel()
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("open channel: %w", err))...)
		}
		if err := ch.ExchangeDelete(name, false, false); err != nil {
			var aerr *amqp.Error
			if !errors.As(err, &aerr) || aerr.Code != amqp.NotFound {
				errs = append(errs, fmt.Errorf("delete exchange %s: %w", name, err))
			}
		}
		_ = ch.Close()
	}
	return errors.Join(errs...)
}

// span is when a consumer got its first delivery and settled its last.
type span struct {
	first, last time.Time
}

func (s span) seconds() float64 { return s.last.Sub(s.first).Seconds() }

// consumeAll consumes n messages of the queue name with the given prefetch and
// hands each to handle on one goroutine, in order. It returns the span from
// the first delivery to the moment the broker had processed the last ack
// (a synchronous call on the same channel follows it). onFirst runs at the
// first delivery, before handle.
func (b *broker) consumeAll(ctx context.Context, name string, n, prefetch int, onFirst func(),
	handle func(ctx context.Context, ch *amqp.Channel, d *amqp.Delivery, last bool) error) (span, error) {
	return consumeOn(ctx, b.Conn, name, n, prefetch, onFirst, handle)
}

// consumeOn is consumeAll on the connection conn.
func consumeOn(ctx context.Context, conn *amqp.Connection, name string, n, prefetch int, onFirst func(),
	handle func(ctx context.Context, ch *amqp.Channel, d *amqp.Delivery, last bool) error) (span, error) {
	var s span
	ch, err := conn.Channel()
	if err != nil {
		return s, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return s, fmt.Errorf("qos: %w", err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, name, "", false, false, false, false, nil)
	if err != nil {
		return s, fmt.Errorf("consume %s: %w", name, err)
	}
	for i := range n {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
		case <-ctx.Done():
			return s, ctx.Err()
		}
		if !ok {
			return s, fmt.Errorf("deliveries closed after %d of %d messages", i, n)
		}
		if i == 0 {
			s.first = time.Now()
			if onFirst != nil {
				onFirst()
			}
		}
		if err := handle(ctx, ch, &d, i == n-1); err != nil {
			return s, err
		}
	}
	// Acks are asynchronous: a round trip on the same channel returns once
	// the broker has processed every frame before it.
	if _, err := ch.QueueDeclarePassive(name, true, false, false, false, nil); err != nil {
		return s, fmt.Errorf("sync after last ack: %w", err)
	}
	s.last = time.Now()
	return s, nil
}

// pacer publishes at a fixed rate without waiting for each confirm, so
// that confirms do not slow the pace; every confirm is checked at the end.
// A transient pacer publishes as Hawk's workers do (Worker.addTask:
// sendToQueue on a plain channel): transient messages, no confirms.
type pacer struct {
	rate      float64 // messages per second
	total     int
	transient bool
}

// run publishes total messages made by msg(i), called at the moment message
// i is due (so it can stamp it).
func (p pacer) run(ctx context.Context, b *broker, msg func(i int) queue.Message, sent *atomic.Int64) error {
	ch, err := b.Conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	mode, confirms := amqp.Persistent, (chan amqp.Confirmation)(nil)
	if p.transient {
		mode = amqp.Transient
	} else {
		if err := ch.Confirm(false); err != nil {
			return fmt.Errorf("confirm mode: %w", err)
		}
		confirms = ch.NotifyPublish(make(chan amqp.Confirmation, p.total+1))
	}
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := 0; i < p.total; {
		due := min(int(time.Since(start).Seconds()*p.rate)+1, p.total)
		for ; i < due; i++ {
			m := msg(i)
			err := ch.PublishWithContext(ctx, m.Exchange, m.RoutingKey, false, false, amqp.Publishing{
				ContentType: "application/json", DeliveryMode: mode, Body: m.Body, MessageId: m.MessageID,
			})
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			sent.Add(1)
		}
		if i < p.total {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if p.transient {
		// No confirms to wait for. A publish the broker refused (to an
		// exchange that does not exist, say) closes the channel, and the
		// close comes before the answer to a synchronous method sent after
		// every publish.
		if err := ch.Qos(0, 0, false); err != nil {
			return fmt.Errorf("paced publishing: %w", err)
		}
		return nil
	}
	for range p.total {
		select {
		case c := <-confirms:
			if !c.Ack {
				return errors.New("broker nacked a paced message")
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Second):
			return errors.New("no confirm for 30 s")
		}
	}
	return nil
}
