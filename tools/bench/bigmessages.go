package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// runBigMessages is the -big-messages mode: what a backlog of big messages
// costs a worker in memory. It fills the run's queue with o.bigMessages
// messages of o.bigMiB MiB, starts the worker on it with no rules (every
// message is over the 256 KiB an event may have, so each is dead-lettered
// before rules matter), waits until each is dead-lettered, and returns a
// line with the worker's peak resident set and the time from its start.
func runBigMessages(ctx context.Context, o options, stderr io.Writer) (line string, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.bigTimeout)
	defer cancel()
	b := newBench(o, stderr)
	defer b.prog.end()
	if err := b.makeDir(); err != nil {
		return "", err
	}
	defer b.removeDir(&err)
	err = b.connect()
	defer b.close()
	if err != nil {
		return "", err
	}
	b.queues = append([]string{b.queue, wire.DeadQueue(b.queue)}, workerQueues(b.prefix)...)
	defer b.cleanup()

	if err := b.buildWorker(ctx); err != nil {
		return "", err
	}
	b.rulesYML = filepath.Join(b.dir, "rules.yaml")
	if err := os.WriteFile(b.rulesYML, []byte("{}\n"), 0o600); err != nil {
		return "", fmt.Errorf("write rules file: %w", err)
	}
	if err := b.fillBig(ctx); err != nil {
		return "", err
	}

	start := time.Now()
	env := b.workerEnv(b.prefix, map[string]string{"KLAXON_LOG_LEVEL": "warn"})
	w, err := startWorker(b.o.workerBin, env, filepath.Join(b.dir, "worker.log"))
	if err != nil {
		return "", err
	}
	peak, err := b.waitDeadLettered(ctx, w)
	took := time.Since(start)
	if stopErr := w.stop(); err == nil {
		err = stopErr
	}
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d messages of %d MiB dead-lettered in %s; worker peak RSS (VmHWM) %d MiB; env %q",
		o.bigMessages, o.bigMiB, took.Round(100*time.Millisecond), peak>>20, envString(o.workerEnv)), nil
}

// fillBig declares the run's queue and publishes the backlog to it, one
// message at a time, each confirmed before the next: a broker that refuses
// one (max_message_size) says so before the rest is sent. The messages
// share one body, so the bench holds one message's size, not the backlog's.
func (b *bench) fillBig(ctx context.Context) error {
	if err := b.br.Declare(ctx, b.queue, nil); err != nil {
		return err
	}
	body := make([]byte, b.o.bigMiB<<20)
	done := b.prog.phase(fmt.Sprintf("fill %d × %d MiB", b.o.bigMessages, b.o.bigMiB), int64(b.o.bigMessages))
	err := b.br.fill(ctx, b.o.bigMessages, 1, func(i int) queue.Message {
		return queue.Message{RoutingKey: b.queue, MessageID: fmt.Sprintf("big-%d", i), Body: body}
	}, done)
	if err != nil {
		return fmt.Errorf("messages of %d MiB (above the broker's max_message_size?): %w", b.o.bigMiB, err)
	}
	return nil
}

// waitDeadLettered polls the worker until its klaxon_events_total{outcome=
// "dead"} reaches the backlog, and returns its peak resident set (VmHWM),
// read at every poll: it is gone with the process, and a timeout reports
// the peak so far.
func (b *bench) waitDeadLettered(ctx context.Context, w *worker) (int64, error) {
	done := b.prog.phase("dead-lettered", int64(b.o.bigMessages))
	var peak int64
	for {
		// /metrics answers once the worker is up: until then, poll again.
		m, scrapeErr := w.metrics(ctx, b.http)
		if rss, err := peakRSS(w.pid()); err == nil {
			peak = rss
		}
		if scrapeErr == nil {
			done.Store(int64(m["dead"]))
			if m["dead"] >= float64(b.o.bigMessages) {
				b.prog.end() // its time is the measurement's, without the stop and cleanup
				return peak, nil
			}
		}
		if err := b.pollWorker(ctx, w, peak); err != nil {
			return peak, err
		}
	}
}

// pollWorker waits for the next poll, failing if the worker exited or
// the -big-timeout passed first.
func (b *bench) pollWorker(ctx context.Context, w *worker, peak int64) error {
	select {
	case <-w.exited:
		return fmt.Errorf("worker exited before it dead-lettered every message (%w); log: %s",
			cmp.Or(w.waitErr, errors.New("exit status 0")), tail(w.logPath, 10))
	case <-ctx.Done():
		return fmt.Errorf("not every message was dead-lettered within %s (peak RSS so far %d MiB): %w",
			b.o.bigTimeout, peak>>20, ctx.Err())
	case <-time.After(100 * time.Millisecond):
		return nil
	}
}

// envString is -env as the worker got it, sorted, for the result line.
func envString(env map[string]string) string {
	var kvs []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		kvs = append(kvs, k+"="+env[k])
	}
	return strings.Join(kvs, ",")
}
