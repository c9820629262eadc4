package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// HashExchangeType is the exchange type of RabbitMQ's consistent-hash
// exchange (the rabbitmq_consistent_hash_exchange plugin, shipped with the
// broker but not enabled): it routes each message to one of its bound queues
// by a hash of the routing key, so that one key always lands on one queue
// while the set of queues stays the same.
const HashExchangeType = "x-consistent-hash"

// ErrNoHashExchange means the broker does not know the x-consistent-hash
// exchange type: its plugin is not enabled.
var ErrNoHashExchange = errors.New("the broker has no " + HashExchangeType + " exchange type; " +
	"enable its plugin: rabbitmq-plugins enable rabbitmq_consistent_hash_exchange (no restart needed)")

// hashWeight is every queue's binding key: its weight on the hash ring.
// Equal weights share the keys out evenly.
const hashWeight = "1"

// DeclareHashExchange declares a durable consistent-hash exchange, so that a
// worker fails at start, with ErrNoHashExchange, on a broker without the
// plugin. Consumers with ConsumerConfig.Exchange declare it again on every
// connection.
func (p *Publisher) DeclareHashExchange(ctx context.Context, name string) error {
	pc, err := p.connection(ctx)
	if err != nil {
		return err
	}
	return pc.do(ctx, func() error {
		ch, err := pc.conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel to declare exchange %q: %w", name, err)
		}
		defer ch.Close()
		return declareExchange(ch, name, HashExchangeType)
	})
}

// declareExchange declares a durable exchange of kind. An unknown kind
// closes the whole connection (COMMAND_INVALID) on RabbitMQ 3 and the
// channel (PRECONDITION_FAILED) on RabbitMQ 4; an exchange of another kind
// closes the channel (PRECONDITION_FAILED): each is reported with what to do.
func declareExchange(ch *amqp.Channel, name, kind string) error {
	if err := ch.ExchangeDeclare(name, kind, true, false, false, false, nil); err != nil {
		return explainDeclare(name, kind, err)
	}
	return nil
}

// explainDeclare turns the broker's refusal to declare an exchange into an
// error that says what to do.
func explainDeclare(name, kind string, err error) error {
	var aerr *amqp.Error
	if errors.As(err, &aerr) {
		switch {
		case unknownType(aerr):
			if kind == HashExchangeType {
				return fmt.Errorf("declare exchange %q: %w (broker said: %s)", name, ErrNoHashExchange, aerr.Reason)
			}
			return fmt.Errorf("declare exchange %q: the broker has no %s exchange type (broker said: %s)", name, kind, aerr.Reason)
		case aerr.Code == amqp.PreconditionFailed:
			return fmt.Errorf("declare exchange %q: it exists with other settings (broker said: %s); "+
				"Klaxon needs a durable %s exchange of that name: delete the other one, or set another KLAXON_QUEUE", name, aerr.Reason, kind)
		}
	}
	return fmt.Errorf("declare exchange %q: %w", name, err)
}

// unknownType reports whether the broker refused a declare for its
// exchange type. The reason tells, not the code: RabbitMQ 3 answers
// COMMAND_INVALID, RabbitMQ 4 PRECONDITION_FAILED, the code an exchange of
// another kind also gets; both say "unknown exchange type".
func unknownType(err *amqp.Error) bool {
	return strings.Contains(err.Reason, "unknown exchange type")
}

// bindHashed declares the consistent-hash exchange and binds queue to it
// with weight 1. Both are idempotent: done on every connection, they bind
// again a queue that was deleted and declared anew.
func bindHashed(conn *amqp.Connection, exchange, queue string) error {
	return bind(conn, exchange, HashExchangeType, queue)
}

func bind(conn *amqp.Connection, exchange, kind, queue string) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel to bind queue %q: %w", queue, err)
	}
	defer ch.Close()
	if err := declareExchange(ch, exchange, kind); err != nil {
		return err
	}
	if err := ch.QueueBind(queue, hashWeight, exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %q to exchange %q: %w", queue, exchange, err)
	}
	return nil
}
