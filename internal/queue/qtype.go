package queue

import (
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Type is the RabbitMQ queue type of the queues Klaxon creates. It never
// applies to a queue that exists: a queue's type cannot change, so an
// existing queue is used as it is, whatever its type.
type Type string

const (
	// Classic queues live on one node: the cheapest, and what Klaxon made
	// before it had a choice. The zero Type means Classic.
	Classic Type = "classic"
	// Quorum queues replicate every message to a majority of the cluster's
	// nodes (Raft) before confirming it: they survive the loss of a node.
	Quorum Type = "quorum"
)

// ParseType reads "classic" or "quorum", in any case.
func ParseType(s string) (Type, error) {
	switch t := Type(strings.ToLower(s)); t {
	case Classic, Quorum:
		return t, nil
	}
	return "", fmt.Errorf("%q is not one of classic, quorum", s)
}

// with returns args with x-queue-type set to t, unless args names a type
// already (retry queues are quorum whatever the setting). Classic adds
// nothing, so a classic declaration is exactly what earlier Klaxons sent,
// and an existing queue made by one still matches it.
func (t Type) with(args amqp.Table) amqp.Table {
	if t == "" || t == Classic {
		return args
	}
	if _, ok := args["x-queue-type"]; ok {
		return args
	}
	out := make(amqp.Table, len(args)+1)
	for k, v := range args {
		out[k] = v
	}
	out["x-queue-type"] = string(t)
	return out
}
