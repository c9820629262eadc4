package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

const benchMessages = 10_000

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// BenchmarkPublish publishes 10k persistent 200-byte messages per op with
// confirms, in calls of `batch` messages from `writers` goroutines.
func BenchmarkPublish(b *testing.B) {
	for _, tc := range []struct{ batch, writers int }{{1, 1}, {1, 16}, {100, 1}, {1000, 1}, {100, 8}} {
		b.Run(fmt.Sprintf("batch=%d/writers=%d", tc.batch, tc.writers), func(b *testing.B) {
			br := newBroker(b)
			q := br.queueName()
			pub := newPublisher(b, queue.PublisherConfig{Logger: quietLogger()})
			if err := pub.Declare(b.Context(), q, nil); err != nil {
				b.Fatal(err)
			}
			body := make([]byte, 200)
			per := benchMessages / tc.writers
			for b.Loop() {
				var wg sync.WaitGroup
				for range tc.writers {
					wg.Go(func() {
						msgs := make([]queue.Message, tc.batch)
						for i := range msgs {
							msgs[i] = queue.Message{RoutingKey: q, Body: body, ContentType: "application/json"}
						}
						for sent := 0; sent < per; sent += tc.batch {
							if err := pub.Publish(b.Context(), msgs[:min(tc.batch, per-sent)]...); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				ch := br.channel()
				_, _ = ch.QueuePurge(q, false)
				_ = ch.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(benchMessages*b.N)/b.Elapsed().Seconds(), "msg/s")
		})
	}
}

// BenchmarkConsume consumes and acks 10k messages per op (preloaded outside
// the timer) with a handler that does nothing, so it measures the plumbing:
// delivery, batching and multiple acks. The time includes connecting. The
// seventh case is the worker's defaults (KLAXON_PREFETCH, _BATCH_SIZE,
// _MAX_HELD_BYTES); the last is its deliverer's (64 one-message batches
// at once), with a handler that uses 64 KiB of stack, as one going
// through JSON, Redis and HTTP does. cpu-µs/msg is this process' user and
// system time over the consuming, per message.
func BenchmarkConsume(b *testing.B) {
	for _, tc := range []struct {
		prefetch, batch int
		held            int64 // MaxHeldBytes
		concurrency     int
		stack           bool // the handler uses 64 KiB of stack
	}{{100, 100, 0, 1, false}, {1000, 1, 0, 1, false}, {1000, 64, 0, 1, false}, {1000, 256, 0, 1, false}, {2000, 256, 0, 1, false},
		{5000, 1000, 0, 1, false}, {2000, 1000, 64 << 20, 1, false}, {64, 1, 0, 64, true}} {
		name := fmt.Sprintf("prefetch=%d/batch=%d/held=%d", tc.prefetch, tc.batch, tc.held)
		if tc.concurrency > 1 {
			name += fmt.Sprintf("/concurrency=%d/stack=64KiB", tc.concurrency)
		}
		b.Run(name, func(b *testing.B) {
			br := newBroker(b)
			q := br.queueName()
			pub := newPublisher(b, queue.PublisherConfig{Logger: quietLogger()})
			if err := pub.Declare(b.Context(), q, nil); err != nil {
				b.Fatal(err)
			}
			c, err := queue.NewConsumer(queue.ConsumerConfig{URL: testenv.AMQPURL(b), Queue: q, Prefetch: tc.prefetch, MaxBatch: tc.batch,
				MaxHeldBytes: tc.held, Concurrency: tc.concurrency, Logger: quietLogger()})
			if err != nil {
				b.Fatal(err)
			}
			var batches, msgs atomic.Int64
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				fill(b, pub, q, benchMessages)
				var got atomic.Int64
				all := make(chan struct{})
				ctx, cancel := context.WithCancel(b.Context())
				done := make(chan error, 1)
				cpu -= processCPU(b)
				b.StartTimer()

				go func() {
					done <- c.Consume(ctx, func(_ context.Context, batch *queue.Batch) error {
						if tc.stack {
							deepStack(64 << 10)
						}
						batches.Add(1)
						msgs.Add(int64(len(batch.Deliveries)))
						if got.Add(int64(len(batch.Deliveries))) == benchMessages {
							close(all)
						}
						return nil
					})
				}()
				select {
				case <-all:
				case <-time.After(time.Minute):
					b.Fatal("consume timed out")
				}
				b.StopTimer()
				cpu += processCPU(b)
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				br.waitReady(q, 0, 10*time.Second) // every ack landed
				b.StartTimer()
			}
			b.ReportMetric(float64(benchMessages*b.N)/b.Elapsed().Seconds(), "msg/s")
			b.ReportMetric(float64(msgs.Load())/float64(batches.Load()), "msg/batch")
			b.ReportMetric(float64(cpu.Microseconds())/float64(benchMessages*b.N), "cpu-µs/msg")
		})
	}
}

// deepStack uses about n bytes of stack, in frames of 1 KiB.
//
//go:noinline
func deepStack(n int) byte {
	var frame [1024]byte
	frame[n%1024] = byte(n)
	if n <= len(frame) {
		return frame[0]
	}
	return deepStack(n-len(frame)) + frame[n%1024]
}

// processCPU is the user and system time this process has used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
