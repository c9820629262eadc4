package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/deliverer"
)

// broker is the tool's own connection to RabbitMQ: it publishes the events
// and watches queue depths.
type broker struct {
	conn *amqp.Connection

	mu sync.Mutex
	ch *amqp.Channel // for passive declares; replaced when a declare fails
}

func dialBroker(url string) (*broker, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{
		Dial:       amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "klaxon-chaos"},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	return &broker{conn: conn}, nil
}

func (b *broker) close() { _ = b.conn.Close() }

// declare declares a durable queue as the worker does.
func (b *broker) declare(name string) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare %s: %w", name, err)
	}
	return nil
}

// publish publishes msgs to queue, persistent, each with its message-id, at
// most rate per second (0: as fast as the broker takes them), and returns
// once the broker confirmed every one.
func (b *broker) publish(ctx context.Context, queue string, msgs []message, rate int) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	const window = 512 // confirms outstanding at most
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	wait := func() error {
		for _, c := range pending {
			ok, err := c.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("publish confirm: %w", err)
			}
			if !ok {
				return errors.New("broker nacked a published event")
			}
		}
		pending = pending[:0]
		return nil
	}
	start := time.Now()
	for i, m := range msgs {
		if rate > 0 && i%50 == 0 {
			// Pacing, in steps of 50 events: the stream lasts long enough
			// for the kills to land in every stage of the work.
			if ahead := time.Duration(i)*time.Second/time.Duration(rate) - time.Since(start); ahead > 0 {
				if err := pause(ctx, ahead); err != nil {
					return err
				}
			}
		}
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: m.ID, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: m.Body,
		})
		if err != nil {
			return fmt.Errorf("publish %s: %w", m.ID, err)
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

// inspect declares queue passively: how many messages it holds ready (not
// those a consumer holds unacked: AMQP does not tell) and how many
// consumers it has.
func (b *broker) inspect(name string) (amqp.Queue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil || b.ch.IsClosed() {
		ch, err := b.conn.Channel()
		if err != nil {
			return amqp.Queue{}, fmt.Errorf("open channel: %w", err)
		}
		b.ch = ch
	}
	q, err := b.ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return amqp.Queue{}, fmt.Errorf("inspect %s: %w", name, err)
	}
	return q, nil
}

// depth is how many messages queue holds ready.
func (b *broker) depth(name string) (int, error) {
	q, err := b.inspect(name)
	return q.Messages, err
}

// consumers is how many consumers queue has.
func (b *broker) consumers(name string) (int, error) {
	q, err := b.inspect(name)
	return q.Consumers, err
}

// depths sums the ready messages of the queues, naming the first non-empty one.
func (b *broker) depths(names []string) (int, string, error) {
	total, first := 0, ""
	for _, n := range names {
		d, err := b.depth(n)
		if err != nil {
			return 0, "", err
		}
		if d > 0 && first == "" {
			first = fmt.Sprintf("%s: %d", n, d)
		}
		total += d
	}
	return total, first, nil
}

// peek describes up to n messages of queue without taking them: their ids
// and delivery attempt, to say what holds a run up.
func (b *broker) peek(name string, n int) ([]string, error) {
	ch, err := b.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close() // gives back every message got: none is acked
	var out []string
	for range n {
		m, ok, err := ch.Get(name, false)
		if err != nil {
			return out, fmt.Errorf("get from %s: %w", name, err)
		}
		if !ok {
			break
		}
		var job struct {
			Attempt int `json:"attempt"`
		}
		_ = json.Unmarshal(m.Body, &job)
		out = append(out, fmt.Sprintf("%s (attempt %d)", m.MessageId, job.Attempt))
	}
	return out, nil
}

// deleteQueues deletes the queues; one that does not exist is no error.
func (b *broker) deleteQueues(names []string) error {
	var errs []error
	for _, n := range names {
		ch, err := b.conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		if _, err := ch.QueueDelete(n, false, false, false); err != nil {
			var aerr *amqp.Error
			if !errors.As(err, &aerr) || aerr.Code != amqp.NotFound {
				errs = append(errs, fmt.Errorf("delete queue %s: %w", n, err))
			}
			continue // the failed delete closed the channel
		}
		_ = ch.Close()
	}
	return errors.Join(errs...)
}

// klaxonQueues are the queues the workers declare under prefix: the
// delivery queue, the failed queue and the retry ladder, as the deliverer
// itself names them.
type klaxonQueues struct {
	deliveries string
	failed     string
	retries    []string
}

func queuesOf(ctx context.Context, prefix string) (klaxonQueues, error) {
	var rec queueRecorder
	d := deliverer.New(deliverer.Config{Prefix: prefix}, nil, nil, nil, nil, nil)
	if err := d.Declare(ctx, &rec); err != nil {
		return klaxonQueues{}, err
	}
	if len(rec.plain) != 2 || rec.plain[0] != d.Queue() {
		return klaxonQueues{}, fmt.Errorf("the deliverer declares %v, want its queue and failed queue", rec.plain)
	}
	return klaxonQueues{deliveries: rec.plain[0], failed: rec.plain[1], retries: rec.delays}, nil
}

// queueRecorder is a deliverer.Declarer that only records names.
type queueRecorder struct {
	plain, delays []string
}

func (r *queueRecorder) Declare(_ context.Context, name string, _ amqp.Table) error {
	r.plain = append(r.plain, name)
	return nil
}

func (r *queueRecorder) DeclareDelay(_ context.Context, name, _ string, _ time.Duration) error {
	r.delays = append(r.delays, name)
	return nil
}

// deleteKeys deletes every Redis key under prefix + ":".
func deleteKeys(ctx context.Context, rdb *redis.Client, prefix string) error {
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := rdb.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		if err != nil {
			return fmt.Errorf("unlink keys of %s: %w", prefix, err)
		}
		return nil
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("scan keys of %s: %w", prefix, err)
	}
	return flush()
}
