package main

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// The demo leaves nothing behind on the services it shares: its clean-up
// deletes every queue a worker of its names makes, with the messages in
// them, and every Redis key of its prefix, and nothing else: queues left
// with unconsumed events would have the next run consume them.
func TestCleanUpDeletesTheDemosQueuesAndKeysOnly(t *testing.T) {
	ctx := context.Background()
	amqpURL, rdb := testenv.AMQPURL(t), testenv.Redis(t)
	prefix := testenv.KeyPrefix(t)
	n := workerNames(testenv.QueueName(t), prefix)
	testenv.DeleteQueuesAtCleanup(t, n.Queues...)
	if len(n.Queues) != 18 {
		t.Errorf("%d queue names, want the worker's 18: %v", len(n.Queues), n.Queues)
	}

	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{n.Queues[0], n.Queues[2], n.Queues[len(n.Queues)-1]} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", n.Queues[0], false, false, amqp.Publishing{Body: []byte("{}")})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
	for _, k := range []string{prefix + ":sent:a", prefix + ":{storms}", prefix + ":snooze:b"} {
		rdb.Set(ctx, k, "x", 0)
	}
	other := prefix + "-other:sent:a" // someone else's, sharing the start of the name
	rdb.Set(ctx, other, "x", 0)

	got, err := cleanUp(ctx, amqpURL, testenv.RedisURL(), n)
	if err != nil {
		t.Fatal(err)
	}
	if got != (cleaned{queues: 3, messages: 2, keys: 3}) {
		t.Errorf("cleaned %+v, want 3 queues, 2 messages, 3 keys", got)
	}
	for _, q := range n.Queues {
		probe, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := probe.QueueDeclarePassive(q, true, false, false, false, nil); err == nil {
			t.Errorf("queue %s is still there", q)
			probe.Close()
		}
	}
	if rdb.Exists(ctx, other).Val() != 1 {
		t.Error("a key outside the demo's prefix was deleted")
	}
	// Run again, as the next demo run does first: nothing is left.
	if again, err := cleanUp(ctx, amqpURL, testenv.RedisURL(), n); err != nil || again != (cleaned{}) {
		t.Errorf("second clean-up: %+v, %v", again, err)
	}
}
