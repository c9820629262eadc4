package deploy_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/klaxonhq/klaxon/internal/wire"
)

// The lazy-queue policy docs/scaling.md gives operators of brokers before
// 3.12 must take the incoming queue and its shards, by the names Klaxon
// gives them, and no queue of its own: the dead letters, delivery jobs and
// retries stay short and gain nothing from it.
func TestLazyPolicyTakesTheIncomingQueues(t *testing.T) {
	raw, err := os.ReadFile("../docs/scaling.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`rabbitmqctl set_policy klaxon-lazy '([^']+)' '\{"queue-mode":"lazy"\}' --apply-to queues`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("docs/scaling.md: no `rabbitmqctl set_policy klaxon-lazy '<pattern>' '{\"queue-mode\":\"lazy\"}' --apply-to queues` line")
	}
	pattern, err := regexp.Compile(string(m[1]))
	if err != nil {
		t.Fatalf("docs/scaling.md: policy pattern %q: %v", m[1], err)
	}
	const queue = "notifier" // KLAXON_QUEUE's default, which the command names
	for _, q := range []string{queue, wire.HashedQueue(queue, 0), wire.HashedQueue(queue, 7), wire.HashedQueue(queue, 63)} {
		if !pattern.MatchString(q) {
			t.Errorf("policy pattern %q misses incoming queue %q", m[1], q)
		}
	}
	for _, q := range []string{wire.DeadQueue(queue), wire.DeliveryQueue("klaxon"), wire.FailedQueue("klaxon"),
		wire.RetryQueue("klaxon", wire.RetryDelays()[0]), queue + "2", "x" + queue} {
		if pattern.MatchString(q) {
			t.Errorf("policy pattern %q takes %q, which is not an incoming queue", m[1], q)
		}
	}
}
