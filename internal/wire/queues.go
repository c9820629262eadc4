package wire

import (
	"slices"
	"strconv"
	"time"
)

// ErrorHeader is the header of a message Klaxon set aside, a dead letter
// (docs/contract.md §2.3) or a failed notification (§5.7), saying why.
const ErrorHeader = "x-klaxon-error"

// DeadQueue is the queue of poison messages taken from the incoming queue
// (§2.3): <queue>.dead.
func DeadQueue(queue string) string { return queue + ".dead" }

// HashedQueue is hashed incoming queue i of n (KLAXON_QUEUE_SHARDS):
// <queue>.<i>, bound to HashExchange(queue).
func HashedQueue(queue string, i int) string { return queue + "." + strconv.Itoa(i) }

// HashExchange is the consistent-hash exchange that spreads incoming events
// over the hashed queues by their routing key, the groupHash: <queue>.hash.
func HashExchange(queue string) string { return queue + ".hash" }

// DeliveryQueue is the queue of delivery jobs (§6): <prefix>.deliveries.
func DeliveryQueue(prefix string) string { return prefix + ".deliveries" }

// BulkQueue is the delivery queue of the jobs past their project's share
// of DeliveryQueue: <prefix>.deliveries.bulk.
func BulkQueue(prefix string) string { return prefix + ".deliveries.bulk" }

// FailedQueue is the queue of notifications that failed for good (§5.7):
// <prefix>.failed.
func FailedQueue(prefix string) string { return prefix + ".failed" }

// RetryQueue is the retry queue holding jobs for delay, named with Go's
// duration format (§6): <prefix>.retry.<delay>.
func RetryQueue(prefix string, delay time.Duration) string {
	return prefix + ".retry." + delay.String()
}

// retryDelays is the retry ladder: one queue per delay, since a queue has
// one TTL.
var retryDelays = [...]time.Duration{
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
	32 * time.Second, 64 * time.Second, 128 * time.Second, 256 * time.Second, 512 * time.Second,
}

// RetryDelays are the delays of the retry queues, shortest first.
func RetryDelays() []time.Duration { return slices.Clone(retryDelays[:]) }
