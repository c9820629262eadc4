package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/wire"
	"github.com/klaxonhq/klaxon/tools/internal/rabbit"
)

// broker is the tool's own access to RabbitMQ: the Publisher declares,
// publishes the events, counts ready messages and deletes queues; the
// plain connection counts consumers and peeks at messages.
type broker struct{ *rabbit.Broker }

func dialBroker(url string) (*broker, error) {
	b, err := rabbit.Dial(url, "klaxon-chaos", "") // queues of the default type
	if err != nil {
		return nil, err
	}
	return &broker{b}, nil
}

// publish publishes msgs to the queue name, each with its message-id, at
// most rate per second (0: as fast as the broker takes them), and returns
// once the broker confirmed every one.
func (b *broker) publish(ctx context.Context, name string, msgs []message, rate int) error {
	step := 512 // confirms outstanding at most
	if rate > 0 {
		// Pacing, in steps of 50 events: the stream lasts long enough for
		// the kills to land in every stage of the work.
		step = 50
	}
	start := time.Now()
	batch := make([]queue.Message, 0, step)
	for i := 0; i < len(msgs); i += step {
		if rate > 0 {
			if ahead := time.Duration(i)*time.Second/time.Duration(rate) - time.Since(start); ahead > 0 {
				if err := pause(ctx, ahead); err != nil {
					return err
				}
			}
		}
		batch = batch[:0]
		for _, m := range msgs[i:min(i+step, len(msgs))] {
			batch = append(batch, queue.Message{RoutingKey: name, MessageID: m.ID, ContentType: "application/json", Body: m.Body})
		}
		if err := b.Publish(ctx, batch...); err != nil {
			return fmt.Errorf("publish %d events from %s: %w", len(batch), batch[0].MessageID, err)
		}
	}
	return nil
}

// depth is how many messages queue holds ready (not those a consumer holds
// unacked: AMQP does not tell). It answers after ctx ended too: a run that
// timed out still counts what it left.
func (b *broker) depth(ctx context.Context, name string) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return b.Depth(ctx, name)
}

// consumers is how many consumers queue has.
func (b *broker) consumers(name string) (int, error) {
	q, err := b.Inspect(name)
	return q.Consumers, err
}

// depths sums the ready messages of the queues, naming the first non-empty one.
func (b *broker) depths(ctx context.Context, names []string) (int, string, error) {
	total, first := 0, ""
	for _, n := range names {
		d, err := b.depth(ctx, n)
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
	ch, err := b.Conn.Channel()
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

// klaxonQueues are the queues the workers declare under prefix: the
// delivery queue and its bulk lane, the failed queue and the retry ladder,
// as the wire contract names them.
type klaxonQueues struct {
	deliveries string
	bulk       string
	failed     string
	retries    []string
}

func queuesOf(prefix string) klaxonQueues {
	qs := klaxonQueues{deliveries: wire.DeliveryQueue(prefix), bulk: wire.BulkQueue(prefix), failed: wire.FailedQueue(prefix)}
	for _, d := range wire.RetryDelays() {
		qs.retries = append(qs.retries, wire.RetryQueue(prefix, d))
	}
	return qs
}

// deleteKeys deletes every Redis key under prefix + ":".
func deleteKeys(ctx context.Context, rdb redis.UniversalClient, prefix string) error {
	// On Cluster every master holds some of the keys: scan each, and
	// unlink key by key (a pipeline the client routes by slot).
	scan := func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range batch {
					p.Unlink(ctx, k)
				}
				return nil
			})
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
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, scan)
	case *redis.Client:
		return scan(ctx, c)
	}
	return fmt.Errorf("delete keys of %s: a %T is neither a node nor a cluster", prefix, rdb)
}
