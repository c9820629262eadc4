package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/metrics"
)

// redisReady checks that Redis answers and, when writes wait for replicas
// (KLAXON_REDIS_WAIT_REPLICAS), that enough are connected: without them
// every batch fails its WAIT and is held, so the worker is not ready.
func redisReady(ctx context.Context, rdb redis.UniversalClient, replicas int) error {
	if replicas == 0 {
		return rdb.Ping(ctx).Err()
	}
	info, err := rdb.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if n := connectedReplicas(info); n < replicas {
		return fmt.Errorf("%d replicas connected, KLAXON_REDIS_WAIT_REPLICAS wants %d", n, replicas)
	}
	return nil
}

// connectedReplicas reads connected_slaves from INFO replication.
func connectedReplicas(info string) int {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// heldBatches sets klaxon_batch_held_seconds of every stage to the age of
// the oldest batch it holds for a retry, and says which stages have held
// one longer than limit (KLAXON_MAX_BATCH_HOLD): a stage that cannot get
// past a batch holds every message behind it, while the broker, Redis and
// the rules may all answer.
func heldBatches(consumers []consumer, limit time.Duration, m *metrics.Metrics) error {
	oldest := map[string]time.Duration{}
	var over []string
	for _, c := range consumers {
		age := time.Duration(0)
		if h, ok := c.OldestHold(); ok {
			age = time.Since(h.Since)
			if age > limit {
				over = append(over, fmt.Sprintf("%s has held a batch of %d from %s for %s (%d attempts, over %s): %.300v",
					c.stage, h.Size, c.queue, age.Round(time.Second), h.Attempts, limit, h.Err))
			}
		}
		oldest[c.stage] = max(oldest[c.stage], age)
	}
	for stage, age := range oldest {
		m.BatchHeld.WithLabelValues(stage).Set(age.Seconds())
	}
	if len(over) > 0 {
		return errors.New(strings.Join(over, "; "))
	}
	return nil
}

// dependencies are the names of checks, in the order they are reported.
var dependencies = [...]string{"amqp", "redis", "rules", "batches"}

// check runs every dependency check, sets klaxon_dependency_up, and returns
// one line per dependency and whether all answered.
func check(ctx context.Context, checks map[string]func(context.Context) error, m *metrics.Metrics) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	report, ok := "", true
	for _, name := range dependencies {
		err := checks[name](ctx)
		if err != nil {
			ok = false
			report += fmt.Sprintf("%s: %v\n", name, err)
		} else {
			report += name + ": ok\n"
		}
		// The rules' gauge follows each load (ruleCache): a failed load
		// leaves the last good rules serving, ready but not up. Held
		// batches are no dependency: klaxon_batch_held_seconds tells them.
		if name != "rules" && name != "batches" {
			m.Up.WithLabelValues(name).Set(boolFloat(err == nil))
		}
	}
	return report, ok
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// watch checks the dependencies every few seconds, so that the metric and
// the log say when one goes away even if nobody asks /readyz.
func watch(ctx context.Context, checks map[string]func(context.Context) error, m *metrics.Metrics, log *slog.Logger) error {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	wasOK := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		report, ok := check(ctx, checks, m)
		if ok != wasOK {
			if ok {
				log.Info("all dependencies answer again")
			} else {
				log.Warn("a dependency does not answer; not ready", "report", report)
			}
			wasOK = ok
		}
	}
}
