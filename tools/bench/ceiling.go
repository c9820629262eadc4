package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/queue"
)

// runCeiling consumes the incoming queues acking only: prefetch 1000, a
// multiple-ack every 100 deliveries; several queues at once, a connection
// each, as the workers do.
func (b *bench) runCeiling(ctx context.Context) (Result, error) {
	res := Result{System: "ceiling", Queues: len(b.incoming), Events: b.o.events, Consumed: b.o.events}
	if err := b.fill(ctx, "bare consumer"+b.queuesLabel()); err != nil {
		return res, err
	}
	counts := make([]int, len(b.incoming))
	for i, q := range b.incoming {
		n, err := b.br.ready(q)
		if err != nil {
			return res, err
		}
		counts[i] = n
	}
	conns := make([]*amqp.Connection, len(b.incoming))
	for i := range conns {
		conn, err := amqp.DialConfig(b.o.amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": "klaxon-bench-ceiling"}})
		if err != nil {
			return res, fmt.Errorf("connect to RabbitMQ: %w", err)
		}
		defer conn.Close()
		conns[i] = conn
	}
	m := b.meter(os.Getpid())
	if err := m.begin(ctx); err != nil {
		return res, err
	}
	done := b.prog.phase("bare consumer"+b.queuesLabel(), int64(b.o.events))
	spans := make([]span, len(b.incoming))
	errs := make([]error, len(b.incoming))
	var wg sync.WaitGroup
	for i, q := range b.incoming {
		if counts[i] == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			spans[i], errs[i] = consumeOn(ctx, conns[i], q, counts[i], 1000, nil, func(_ context.Context, ch *amqp.Channel, d *amqp.Delivery, last bool) error {
				n++
				done.Add(1)
				if n%100 == 0 || last {
					return ch.Ack(d.DeliveryTag, true)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if err := m.finish(ctx, &res, res.Events); err != nil {
		return res, err
	}
	var all span
	for i, sp := range spans {
		if counts[i] == 0 {
			continue
		}
		if all.first.IsZero() || sp.first.Before(all.first) {
			all.first = sp.first
		}
		if sp.last.After(all.last) {
			all.last = sp.last
		}
	}
	res.Seconds = all.seconds()
	res.EventsPerSec = float64(res.Events) / res.Seconds
	if b.o.latency > 0 {
		l, err := b.floorLatency(ctx, conns, b.latencyRate(res.EventsPerSec))
		if err != nil {
			return res, fmt.Errorf("floor latency: %w", err)
		}
		res.Latency = l
	}
	return res, nil
}

// latencyRate is the rate of a latency phase after a run at measured
// events/s: -latency-rate, or half the measured rate.
func (b *bench) latencyRate(measured float64) float64 {
	if b.o.latencyRate > 0 {
		return b.o.latencyRate
	}
	return measured / 2
}

// floorLatency is the broker's own part of the latency: the workload
// published at rate for the latency duration, as measureLatency does, and
// every message timed from its publish to its delivery to a bare consumer
// that acks it at once. No system can be faster on this broker and host.
func (b *bench) floorLatency(ctx context.Context, conns []*amqp.Connection, rate float64) (*Latency, error) {
	total := max(int(rate*b.o.latency.Seconds()), 1)
	l := &Latency{Rate: rate, Events: total, Probes: total}
	sent := make([]atomic.Int64, total) // UnixNano of each publish
	got := make([]atomic.Int64, total)  // of each delivery
	var received atomic.Int64
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, len(b.incoming))
	for i, q := range b.incoming {
		ch, err := conns[i].Channel()
		if err != nil {
			return nil, fmt.Errorf("open channel: %w", err)
		}
		defer ch.Close()
		if err := ch.Qos(1000, 0, false); err != nil {
			return nil, fmt.Errorf("qos: %w", err)
		}
		deliveries, err := ch.ConsumeWithContext(cctx, q, "", false, false, false, false, nil)
		if err != nil {
			return nil, fmt.Errorf("consume %s: %w", q, err)
		}
		go func() {
			for d := range deliveries {
				now := time.Now().UnixNano()
				if n, err := strconv.Atoi(d.MessageId); err == nil && n >= 0 && n < total {
					got[n].Store(now)
					received.Add(1)
				}
				if err := d.Ack(false); err != nil {
					errs <- fmt.Errorf("ack: %w", err)
					return
				}
			}
		}()
	}
	phase := b.prog.phase(fmt.Sprintf("floor latency at %s/s", thousands(rate)), int64(total))
	p := b.pacer(rate, total)
	span, err := loadWhile(b.hostProcs(), func() error {
		return p.run(ctx, b.br, func(i int) queue.Message {
			sent[i].Store(time.Now().UnixNano())
			m := b.message(b.work.groupHash(i), b.work.body(1, i))
			m.MessageID = strconv.Itoa(i)
			return m
		}, phase)
	})
	l.HostBusy, l.Cores = span.busy, span.cores()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for received.Load() < int64(total) && time.Now().Before(deadline) {
		select {
		case err := <-errs:
			return nil, err
		default:
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	lat := make([]time.Duration, 0, total)
	for i := range total {
		if g := got[i].Load(); g != 0 {
			lat = append(lat, time.Duration(g-sent[i].Load()))
		}
	}
	l.summarize(lat, nil)
	return l, nil
}
