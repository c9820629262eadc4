// Package rabbit is the tools' own access to RabbitMQ: Klaxon's Publisher
// for what it does (declare, publish confirmed, count ready messages,
// delete queues) and a plain connection beside it for what it does not.
package rabbit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/queue"
)

// Broker is a Publisher and a plain connection to the same broker, both
// named as the tool that opened them.
type Broker struct {
	*queue.Publisher
	Conn *amqp.Connection

	mu      sync.Mutex
	inspect *amqp.Channel // Inspect's; replaced when a declare fails
}

// Dial opens both connections under name. The queues the Publisher
// declares are of type typ.
func Dial(url, name string, typ queue.Type) (*Broker, error) {
	pub, err := queue.NewPublisher(queue.PublisherConfig{URL: url, ConnectionName: name, QueueType: typ,
		Logger: slog.New(slog.DiscardHandler)}) // its failures come back as errors
	if err != nil {
		return nil, err
	}
	conn, err := queue.Dial(context.Background(), url, name)
	if err != nil {
		_ = pub.Close()
		return nil, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	return &Broker{Publisher: pub, Conn: conn}, nil
}

// Close closes both connections.
func (b *Broker) Close() error {
	return errors.Join(b.Publisher.Close(), b.Conn.Close())
}

// Inspect is the queue name as a passive declare tells it (its ready
// messages and consumers), on one channel kept for it: a tool that polls
// a queue opens no channel a poll, as Publisher.Depth does, which would add
// to the broker CPU the bench measures.
func (b *Broker) Inspect(name string) (amqp.Queue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inspect == nil || b.inspect.IsClosed() {
		ch, err := b.Conn.Channel()
		if err != nil {
			return amqp.Queue{}, fmt.Errorf("open channel: %w", err)
		}
		b.inspect = ch
	}
	q, err := b.inspect.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return amqp.Queue{}, fmt.Errorf("inspect queue %s: %w", name, err)
	}
	return q, nil
}
