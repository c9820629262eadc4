package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// Every delivery job in flight can have a Redis connection of its own:
// with Redis' writes paused, the deliverer's 64 jobs all wait in their
// claims at once, each on a connection. go-redis' default pool, ten
// connections per Go processor (and ten more for pipelines), queued most
// of them behind the others, which lengthened the time between a send and
// its record, where a crash repeats a notification. Once writes resume,
// each job is sent once.
func TestEveryDeliveryJobHasARedisConnection(t *testing.T) {
	const jobs = 64 // the deliverer's prefetch
	r := startRedis(t)
	h := newHarness(t)
	h.env["KLAXON_REDIS_URL"] = r.URL()
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))

	// Counted first, by an evaluator alone: the jobs wait in the queue.
	h.env["KLAXON_ROLE"] = "evaluator"
	h.start()
	var msgs []message
	for i := range jobs {
		msgs = append(msgs, event(project, fmt.Sprintf("error %d", i), fmt.Sprintf("g%d", i), true))
	}
	h.publish(msgs...)
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%d delivery jobs queued", jobs), func() bool {
		return h.deliveryJobsReady(t) == jobs
	})

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + r.port})
	defer rdb.Close()
	ctx := context.Background()
	clients := func() int {
		info, err := rdb.InfoMap(ctx, "clients").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int
		fmt.Sscan(info["Clients"]["connected_clients"], &n)
		return n
	}
	before := clients()
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", 20000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	h.env["KLAXON_ROLE"] = "deliverer"
	h.start()
	testenv.WaitFor(t, 15*time.Second, "a connection for each job's claim", func() bool { return clients()-before >= jobs })
	if err := rdb.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	h.webhookBodies(jobs)
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, jobs)
}
