package queue

import (
	"encoding/json"
	"fmt"
	"regexp"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Bounds limit a queue that keeps what nobody consumes (`<queue>.dead`,
// `<prefix>.failed`): past either limit the broker drops the oldest
// messages, so the newest, the ones an operator looks at, are kept and one
// project's poison cannot fill the broker's disk.
type Bounds struct {
	MaxMessages int   // x-max-length
	MaxBytes    int64 // x-max-length-bytes: message bodies only
}

// Default bounds of the dead-letter and failed queues.
const (
	DefaultMaxMessages = 100_000
	DefaultMaxBytes    = 256 << 20
)

// Args are the queue arguments of b; a zero field takes its default.
func (b Bounds) Args() amqp.Table {
	if b.MaxMessages <= 0 {
		b.MaxMessages = DefaultMaxMessages
	}
	if b.MaxBytes <= 0 {
		b.MaxBytes = DefaultMaxBytes
	}
	return amqp.Table{
		"x-max-length":       int64(b.MaxMessages),
		"x-max-length-bytes": b.MaxBytes,
		"x-overflow":         "drop-head",
	}
}

// boundsAdvice tells an operator how to bound a queue that exists without
// the bounds in args (made by an earlier Klaxon): arguments of an existing
// queue cannot change, but a policy applies to it at once. "" when args
// carry no bounds.
func boundsAdvice(name string, args amqp.Table) string {
	def := map[string]any{}
	if v, ok := args["x-max-length"]; ok {
		def["max-length"] = v
	}
	if v, ok := args["x-max-length-bytes"]; ok {
		def["max-length-bytes"] = v
	}
	if len(def) == 0 {
		return ""
	}
	if v, ok := args["x-overflow"]; ok {
		def["overflow"] = v
	}
	js, _ := json.Marshal(def) // numbers and strings only
	return fmt.Sprintf("this queue was made without these limits (by an earlier Klaxon, or with other settings) "+
		"and keeps them; bound it with a policy: "+
		"rabbitmqctl set_policy --apply-to queues klaxon-bounds-%s '^%s$' '%s' "+
		"(a policy applies to the existing queue and its messages at once), or delete the queue once empty "+
		"and Klaxon declares it with the limits at its next start", name, regexp.QuoteMeta(name), js)
}
