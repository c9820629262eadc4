package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/tools/baseline"
)

// hawkBaseline processes events the way Hawk's notifier does: one message at
// a time; per event and per matching SEEN_MORE rule one EVALSHA of Hawk's
// fixed-window script (a round trip each); ONLY_NEW fires on isNew without
// Redis; a firing is handed on by a publish without confirm (Hawk's
// notifier pushes to its sender workers' queues); and every message is
// acked on its own.
type hawkBaseline struct {
	rdb    *redis.Client
	script *redis.Script
	rules  *store.Snapshot
	prefix string // of Redis keys
	out    string // queue that receives firings
	fired  int
}

func newHawkBaseline(ctx context.Context, rdb *redis.Client, rulesFile, prefix, out string) (*hawkBaseline, error) {
	specs, err := store.NewFileSource(rulesFile).Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("hawk baseline rules: %w", err)
	}
	h := &hawkBaseline{rdb: rdb, script: redis.NewScript(baseline.HawkLua), rules: store.Compile(specs, time.Now()), prefix: prefix, out: out}
	if err := h.script.Load(ctx, rdb).Err(); err != nil {
		return nil, fmt.Errorf("load hawk.lua: %w", err)
	}
	return h, nil
}

// handle processes one delivery and acks it.
func (h *hawkBaseline) handle(ctx context.Context, ch *amqp.Channel, d *amqp.Delivery) error {
	m, err := event.Decode(d.Body)
	if err != nil {
		return ch.Ack(d.DeliveryTag, false) // Hawk drops what it cannot parse
	}
	for _, r := range h.rules.Rules(m.ProjectID) {
		if !r.Matches(m.Event.Title, m.Event.IsNew) {
			continue
		}
		fires := r.OnlyNew
		if !r.OnlyNew {
			w := r.Windows[0] // Hawk has one threshold and period per rule
			key := h.prefix + ":" + m.ProjectID + ":" + r.ID + ":" + m.Event.GroupHash + ":" + strconv.FormatInt(w.Period.Milliseconds(), 10)
			n, err := h.script.EvalSha(ctx, h.rdb, []string{key}, time.Now().UnixMilli(), w.Period.Milliseconds(), w.Threshold).Int()
			if err != nil {
				return fmt.Errorf("hawk.lua: %w", err)
			}
			fires = n == 1
		}
		if fires {
			h.fired++
			err := ch.PublishWithContext(ctx, "", h.out, false, false, amqp.Publishing{
				ContentType: "application/json", Body: d.Body,
			})
			if err != nil {
				return fmt.Errorf("publish firing: %w", err)
			}
		}
	}
	return ch.Ack(d.DeliveryTag, false)
}

// runHawk consumes the queue the way Hawk's notifier does (see hawkBaseline).
func (b *bench) runHawk(ctx context.Context) (Result, error) {
	res := Result{System: "hawk", Queues: 1, Events: b.o.events, Consumed: b.o.events}
	h, err := newHawkBaseline(ctx, b.rdb, b.rulesYML, b.prefix+":hawk", b.prefix+".hawk-out")
	if err != nil {
		return res, err
	}
	if err := b.br.Declare(ctx, h.out, nil); err != nil {
		return res, err
	}
	if err := b.fill(ctx, "Hawk-style"); err != nil {
		return res, err
	}
	m := b.meter(os.Getpid())
	if err := m.begin(ctx); err != nil {
		return res, err
	}
	done := b.prog.phase("Hawk-style", int64(b.o.events))
	sp, err := b.br.consumeAll(ctx, b.queue, b.o.events, 1000, nil, func(ctx context.Context, ch *amqp.Channel, d *amqp.Delivery, _ bool) error {
		done.Add(1)
		return h.handle(ctx, ch, d)
	})
	if err != nil {
		return res, err
	}
	if err := m.finish(ctx, &res, res.Events); err != nil {
		return res, err
	}
	res.Seconds = sp.seconds()
	res.EventsPerSec = float64(res.Events) / res.Seconds
	res.Notifications = int64(h.fired)
	return res, nil
}
