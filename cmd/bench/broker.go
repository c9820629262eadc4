package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// broker is the bench's own connection to RabbitMQ.
type broker struct {
	url  string
	conn *amqp.Connection
}

func dialBroker(url string) (*broker, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Properties: amqp.Table{"connection_name": "klaxon-bench"}})
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	return &broker{url: url, conn: conn}, nil
}

func (b *broker) close() { _ = b.conn.Close() }

// version is RabbitMQ's version as it announced it.
func (b *broker) version() string {
	v, _ := b.conn.Properties["version"].(string)
	return v
}

// declare declares a durable queue as the worker does (no arguments).
func (b *broker) declare(name string) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", name, err)
	}
	return nil
}

// depth is the number of messages ready in the queue (not those delivered
// and unacked).
func (b *broker) depth(ch *amqp.Channel, name string) (int, error) {
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("inspect queue %s: %w", name, err)
	}
	return q.Messages, nil
}

// deleteQueues deletes the queues, each on its own channel since deleting
// a queue that does not exist may close the channel.
func (b *broker) deleteQueues(names ...string) {
	for _, name := range names {
		ch, err := b.conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.Close()
	}
}

// purge empties a queue.
func (b *broker) purge(name string) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueuePurge(name, false); err != nil {
		return fmt.Errorf("purge %s: %w", name, err)
	}
	return nil
}

// fill publishes n messages made by body to the queue, persistent, with
// publisher confirms and at most window unconfirmed, and returns once every
// one is confirmed. done counts confirmed messages for the progress bar.
func (b *broker) fill(ctx context.Context, queue string, n int, body func(i int) []byte, done *atomic.Int64) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	const window = 2000
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	wait := func() error {
		for _, c := range pending {
			ok, err := c.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("wait for confirm: %w", err)
			}
			if !ok {
				return errors.New("broker nacked a message")
			}
		}
		done.Add(int64(len(pending)))
		pending = pending[:0]
		return nil
	}
	for i := range n {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body(i),
		})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		pending = append(pending, c)
		if len(pending) == window {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	return wait()
}

// span is when a consumer got its first delivery and settled its last.
type span struct {
	first, last time.Time
}

func (s span) seconds() float64 { return s.last.Sub(s.first).Seconds() }

// consumeAll consumes n messages of queue with the given prefetch and
// hands each to handle on one goroutine, in order. It returns the span from
// the first delivery to the moment the broker had processed the last ack
// (a synchronous call on the same channel follows it). onFirst runs at the
// first delivery, before handle.
func (b *broker) consumeAll(ctx context.Context, queue string, n, prefetch int, onFirst func(),
	handle func(ctx context.Context, ch *amqp.Channel, d *amqp.Delivery, last bool) error) (span, error) {
	var s span
	ch, err := b.conn.Channel()
	if err != nil {
		return s, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return s, fmt.Errorf("qos: %w", err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		return s, fmt.Errorf("consume %s: %w", queue, err)
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
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		return s, fmt.Errorf("sync after last ack: %w", err)
	}
	s.last = time.Now()
	return s, nil
}

// pacer publishes at a fixed rate without waiting for each confirm, so
// that confirms do not slow the pace; every confirm is checked at the end.
type pacer struct {
	rate  float64 // messages per second
	total int
}

// run publishes total messages made by body(i), body(i) called at the
// moment message i is due (so it can stamp it).
func (p pacer) run(ctx context.Context, b *broker, queue string, body func(i int) []byte, sent *atomic.Int64) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, p.total+1))
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := 0; i < p.total; {
		due := min(int(time.Since(start).Seconds()*p.rate)+1, p.total)
		for ; i < due; i++ {
			err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
				ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body(i),
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
