package testenv

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Take takes (gets and acks) every message now in the named queue of the
// test RabbitMQ, in queue order; none when the queue is empty. The test
// fails if the queue does not exist.
func Take(t testing.TB, queue string) []amqp.Delivery {
	t.Helper()
	conn, err := dialAMQP(AMQPURL(t))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("testenv: open channel: %v", err)
	}
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("testenv: get from %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}
