package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
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
// last case is the worker's defaults (KLAXON_PREFETCH, _BATCH_SIZE,
// _MAX_HELD_BYTES).
func BenchmarkConsume(b *testing.B) {
	for _, tc := range []struct {
		prefetch, batch int
		held            int64 // MaxHeldBytes
	}{{100, 100, 0}, {1000, 1, 0}, {1000, 64, 0}, {1000, 256, 0}, {2000, 256, 0}, {5000, 1000, 0}, {2000, 1000, 64 << 20}} {
		b.Run(fmt.Sprintf("prefetch=%d/batch=%d/held=%d", tc.prefetch, tc.batch, tc.held), func(b *testing.B) {
			br := newBroker(b)
			q := br.queueName()
			pub := newPublisher(b, queue.PublisherConfig{Logger: quietLogger()})
			if err := pub.Declare(b.Context(), q, nil); err != nil {
				b.Fatal(err)
			}
			c, err := queue.NewConsumer(queue.ConsumerConfig{URL: brokerURL(), Queue: q, Prefetch: tc.prefetch, MaxBatch: tc.batch, MaxHeldBytes: tc.held, Logger: quietLogger()})
			if err != nil {
				b.Fatal(err)
			}
			var batches, msgs atomic.Int64
			for b.Loop() {
				b.StopTimer()
				fill(b, pub, q, benchMessages)
				var got atomic.Int64
				all := make(chan struct{})
				ctx, cancel := context.WithCancel(b.Context())
				done := make(chan error, 1)
				b.StartTimer()

				go func() {
					done <- c.Consume(ctx, func(_ context.Context, batch *queue.Batch) error {
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
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				br.waitReady(q, 0, 10*time.Second) // every ack landed
				b.StartTimer()
			}
			b.ReportMetric(float64(benchMessages*b.N)/b.Elapsed().Seconds(), "msg/s")
			b.ReportMetric(float64(msgs.Load())/float64(batches.Load()), "msg/batch")
		})
	}
}
