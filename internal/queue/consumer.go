package queue

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ConsumerConfig configures a Consumer. Zero values take the defaults shown.
type ConsumerConfig struct {
	URL   string // AMQP URL; required
	Queue string // queue to consume; required. Declared durable if missing.
	// QueueArgs are the arguments the queue is declared with when it is
	// missing. An existing queue is used as it is.
	QueueArgs amqp.Table
	// QueueType is the type the queue is declared with when it is missing
	// [Classic]. An existing queue is used as it is, whatever its type.
	QueueType Type
	// Exchange, when set, names a consistent-hash exchange (HashExchangeType,
	// durable, declared if missing) that the queue is bound to with weight 1
	// each time the consumer subscribes: a queue deleted under a running
	// worker comes back bound, and the exchange spreads its messages over
	// the queues that some worker consumes.
	Exchange string
	// ConnectionName is shown in the broker's connection list [klaxon-consumer].
	ConnectionName string
	// Prefetch is the most deliveries the broker sends ahead of acks [1000].
	Prefetch int
	// MaxHeldBytes, when above 0, bounds the bytes of the deliveries held
	// received and not settled, which Prefetch bounds only in messages:
	// past it the Consumer stops consuming until they fall to half of it,
	// and it sizes the prefetch to the messages it sees (feeder.go). 0
	// leaves Prefetch as the only bound.
	MaxHeldBytes int64
	// MaxBatch caps a batch [256]; it is lowered to Prefetch if above it.
	MaxBatch int
	// Linger is how long a batch that is not full waits for more deliveries
	// that are not there yet [2 ms]; negative means not at all.
	Linger time.Duration
	// Backoff spaces reconnects and handler retries [100 ms … 10 s].
	Backoff Backoff
	// Concurrency is how many batches may be handled at once [1]. Each is
	// settled on its own as soon as its handler returns, so a slow batch
	// does not hold up the batches behind it. It is lowered to Prefetch if
	// above it; Prefetch still bounds the deliveries held unacked, whatever
	// the concurrency. Above 1, batches finish in any order, and the handler
	// and Hooks.Batch are called from several goroutines at once.
	Concurrency int
	// InOrder settles batches in the order they were received, whatever
	// the order their handlers return in: a batch done before an older one
	// waits for it, and both go in one multiple-ack, where settling the
	// younger first would take an ack frame per delivery (the broker's
	// work doubles). For handlers whose batches take about the same time;
	// a slow one holds the acks, and so the prefetch, of those behind it.
	InOrder bool
	// Pipelined, with Concurrency above 1, collects a batch only once the
	// batch before it called Batch.Release or its handler returned: for a
	// handler whose first part must run one batch at a time (counting) and
	// whose rest may overlap the next batch's (publishing, waiting for the
	// broker's confirms). The next batch then holds what arrived during
	// that first part, where collected at once it would hold only what was
	// ready then and wait for its turn, while later deliveries wait for a
	// batch after it.
	Pipelined bool
	// StopGrace is how long the handlers in flight may run once ctx is
	// cancelled before their own context is cancelled too [5 s].
	StopGrace time.Duration
	Logger    *slog.Logger // [slog.Default()]
	Hooks     Hooks
}

// Consumer consumes one queue in batches, with manual acks, reconnecting
// whenever the connection or channel is lost. Create it with NewConsumer.
type Consumer struct {
	cfg ConsumerConfig
	log *slog.Logger
	// declareLog is log without the queue, which the declaring code names
	// itself: a JSON line holds each key once.
	declareLog *slog.Logger
	state      *connState

	running atomic.Bool
	// held counts the batches held for a retry after a handler error, so
	// that concurrent batches failing together warn once, not once each.
	held atomic.Int64

	heldMu sync.Mutex
	holds  map[*Batch]*Hold // the batches held for a retry
}

// Hold is a batch that a Consumer holds to retry it after its handler
// failed.
type Hold struct {
	Since    time.Time // when the handler was first called on it
	Size     int       // its deliveries
	Attempts int       // handler calls so far, all failed
	Err      error     // the last one's error
}

// OldestHold returns the batch held the longest, and false when no batch
// is held. A batch is held from its handler's first failure until a call
// succeeds, or the channel that delivered it dies or the Consumer stops,
// which give it back to the broker.
func (c *Consumer) OldestHold() (Hold, bool) {
	c.heldMu.Lock()
	defer c.heldMu.Unlock()
	var oldest *Hold
	for _, h := range c.holds {
		if oldest == nil || h.Since.Before(oldest.Since) {
			oldest = h
		}
	}
	if oldest == nil {
		return Hold{}, false
	}
	return *oldest, true
}

// hold records b's failed attempt; release forgets b.
func (c *Consumer) hold(b *Batch, since time.Time, attempt int, err error) {
	c.heldMu.Lock()
	defer c.heldMu.Unlock()
	if c.holds == nil {
		c.holds = make(map[*Batch]*Hold)
	}
	c.holds[b] = &Hold{Since: since, Size: len(b.Deliveries), Attempts: attempt, Err: err}
}

func (c *Consumer) release(b *Batch) {
	c.heldMu.Lock()
	defer c.heldMu.Unlock()
	delete(c.holds, b)
}

// NewConsumer checks cfg and fills in its defaults. It does not connect.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if err := validateURL(cfg.URL); err != nil {
		return nil, err
	}
	if cfg.Queue == "" {
		return nil, errors.New("consumer: queue name is empty")
	}
	if cfg.ConnectionName == "" {
		cfg.ConnectionName = "klaxon-consumer"
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = 1000
	}
	if cfg.Prefetch < 1 || cfg.Prefetch > 65535 {
		return nil, fmt.Errorf("consumer: prefetch %d is outside 1…65535", cfg.Prefetch)
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 256
	}
	cfg.MaxBatch = min(cfg.MaxBatch, cfg.Prefetch)
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.Concurrency < 1 {
		return nil, fmt.Errorf("consumer: concurrency %d is below 1", cfg.Concurrency)
	}
	// Every batch holds a delivery at least: more could never be in flight.
	cfg.Concurrency = min(cfg.Concurrency, cfg.Prefetch)
	if cfg.Linger == 0 {
		cfg.Linger = 2 * time.Millisecond
	}
	cfg.Backoff = cfg.Backoff.withDefaults()
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	declareLog := cfg.Logger.With("component", "amqp-consumer", "url", redactURL(cfg.URL))
	if cfg.Exchange != "" {
		declareLog = declareLog.With("exchange", cfg.Exchange)
	}
	log := declareLog.With("queue", cfg.Queue)
	return &Consumer{cfg: cfg, log: log, declareLog: declareLog, state: newConnState(log, cfg.Hooks.Connection)}, nil
}

// Connected reports whether the Consumer is consuming right now, for /readyz.
func (c *Consumer) Connected() bool { return c.state.up.Load() }

// Consume runs until ctx is cancelled, calling handle with one batch at a
// time, or up to Concurrency batches at once. It connects, declares the
// queue, and reconnects with Backoff when the connection or channel is lost,
// once every handler in flight on it has returned. When ctx is cancelled it
// stops consuming, lets the handlers in flight finish (StopGrace at most),
// settles their batches, gives every other delivery it holds back to the
// broker, closes the connection and returns nil. A Consumer runs one Consume
// at a time.
func (c *Consumer) Consume(ctx context.Context, handle Handler) error {
	if handle == nil {
		return errors.New("consumer: nil handler")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Consume is already running")
	}
	defer c.running.Store(false)

	// The handler's context outlives ctx by StopGrace at most.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	graceDone := make(chan struct{})
	defer func() { hcancel(); <-graceDone }()
	go func() {
		defer close(graceDone)
		select {
		case <-ctx.Done():
		case <-hctx.Done():
			return
		}
		t := time.NewTimer(c.cfg.StopGrace)
		defer t.Stop()
		select {
		case <-t.C:
			hcancel()
		case <-hctx.Done():
		}
	}()

	failures := 0
	for {
		consumed, err := c.runSession(ctx, hctx, handle)
		if ctx.Err() != nil {
			c.state.setDown(nil)
			return nil
		}
		c.state.setDown(err)
		if consumed {
			failures = 0
		}
		failures++
		if !sleep(ctx, c.cfg.Backoff.Delay(failures)) {
			return nil
		}
	}
}

// runSession is one connection's life: connect, consume, handle batches until
// the channel dies (returns the cause) or ctx ends (returns nil after the
// graceful stop). consumed tells whether it got as far as consuming, which
// resets the reconnect backoff.
func (c *Consumer) runSession(ctx, hctx context.Context, handle Handler) (consumed bool, err error) {
	conn, err := Dial(ctx, c.cfg.URL, c.cfg.ConnectionName)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	var s *session
	defer func() {
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		if s != nil {
			s.wait() // returns now that the connection is closed
		}
	}()

	release := closeOnCancel(ctx, conn)
	s, err = c.subscribe(conn)
	release()
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, err
	}

	// The handler's context also ends with the channel: a batch whose channel
	// died can no longer be acked, so finishing it is wasted work.
	bctx, bcancel := context.WithCancel(hctx)
	defer bcancel()
	stopWatch := context.AfterFunc(s.deadCtx, bcancel)
	defer stopWatch()

	c.state.setUp()
	if c.cfg.Concurrency > 1 {
		kill := func() { _ = conn.CloseDeadline(time.Now().Add(closeTimeout)) }
		return true, c.consumeConcurrently(ctx, bctx, s, handle, kill)
	}
	for {
		b, alive := s.collect(ctx, c.cfg.MaxBatch, c.cfg.Linger)
		if !alive {
			return true, s.cause()
		}
		if b == nil || ctx.Err() != nil {
			return true, s.stop(b, nil)
		}
		s.track(b)
		if err := c.process(ctx, bctx, s, b, handle); err != nil {
			return true, err
		}
		if ctx.Err() != nil {
			return true, s.stop(nil, nil)
		}
	}
}

// consumeConcurrently is runSession's loop for Concurrency above 1: it
// collects a batch whenever fewer than Concurrency are in flight and hands
// each to one of Concurrency handler goroutines, which retries and settles
// that batch alone, just as the one-at-a-time loop does. However the session
// ends, it returns only once every handler has: on a graceful stop after
// they finished (StopGrace), otherwise after kill closed the connection,
// which cancels their contexts.
func (c *Consumer) consumeConcurrently(ctx, bctx context.Context, s *session, handle Handler, kill func()) error {
	slots := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	// failed stops collecting once a batch could not be processed to its
	// end, which only a channel that is gone (or going) causes.
	cctx, failed := context.WithCancelCause(ctx)
	defer failed(nil)
	end := func(err error) error {
		kill()
		wg.Wait()
		return err
	}
	// One long-lived handler per slot, not a goroutine per batch: a fresh
	// goroutine grows its stack anew through the handler's deep calls
	// (JSON, Redis, HTTP) every time, 5% of a worker's CPU at a paced
	// 4,000 events/s. A slot taken means a handler is free, or about to be.
	work := make(chan *Batch)
	defer close(work)
	for range c.cfg.Concurrency {
		go func() {
			for b := range work {
				func() {
					defer wg.Done()
					defer func() { <-slots }()
					defer b.Release()
					if err := c.process(ctx, bctx, s, b, handle); err != nil {
						failed(err)
					}
				}()
			}
		}()
	}
	// released is closed by the batch collected last (Pipelined); unless
	// Pipelined it stays the closed one made here.
	released := make(chan struct{})
	close(released)
	for {
		var b *Batch
		alive := true
		select {
		case slots <- struct{}{}:
			select {
			case <-released:
				b, alive = s.collect(cctx, c.cfg.MaxBatch, c.cfg.Linger)
			case <-cctx.Done():
			}
		case <-cctx.Done():
		}
		// cctx is checked first: it ends with ctx, and a stop that lands
		// between the two checks must still be a graceful one.
		failure := context.Cause(cctx)
		switch {
		case !alive:
			return end(s.cause())
		case ctx.Err() != nil:
			return s.stop(b, wg.Wait)
		case failure != nil:
			return end(failure) // b, if any, comes again
		}
		s.track(b)
		if c.cfg.Pipelined {
			next := make(chan struct{})
			b.release = sync.OnceFunc(func() { close(next) })
			released = next
		}
		wg.Add(1)
		work <- b
	}
}

// subscribe declares the queue, opens the channel and starts consuming. The
// session may be returned with an error: it must be waited for all the same.
func (c *Consumer) subscribe(conn *amqp.Connection) (*session, error) {
	if err := declareConsumed(conn, c.declareLog, c.cfg.Queue, c.cfg.QueueType.with(c.cfg.QueueArgs)); err != nil {
		return nil, err
	}
	if c.cfg.Exchange != "" {
		if err := bindHashed(conn, c.cfg.Exchange, c.cfg.Queue); err != nil {
			return nil, err
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	s := newSession(ch) // watches for the close from before the first delivery
	s.tag = c.cfg.ConnectionName + "-" + rand.Text()
	s.inOrder = c.cfg.InOrder
	s.feeder = newFeeder(ch, s.deadCtx.Done(), c.cfg.Queue, s.tag, max(c.cfg.MaxHeldBytes, 0), c.cfg.Prefetch, c.log, c.cfg.Hooks)
	s.deliveries, err = s.feeder.start()
	return s, err
}

// process calls the handler on b until it succeeds, then settles b. It
// returns an error only when the channel is gone; on ctx cancellation it
// returns nil and leaves b in flight, for stop to give back once the
// consumer is cancelled: given back before, the broker would deliver it
// straight back to this consumer.
func (c *Consumer) process(ctx, bctx context.Context, s *session, b *Batch, handle Handler) error {
	held := false // counted in c.held
	defer func() {
		if held {
			c.held.Add(-1)
			c.release(b)
		}
	}()
	var first time.Time
	for attempt := 1; ; attempt++ {
		b.Attempt = attempt
		clear(b.requeue)
		start := time.Now()
		if attempt == 1 {
			first = start
		}
		err := handle(bctx, b)
		res := BatchResult{Size: len(b.Deliveries), Attempt: attempt, Took: time.Since(start), Err: err}
		if err == nil {
			res.Requeued = countTrue(b.requeue)
			res.Acked = res.Size - res.Requeued
		}
		if c.cfg.Hooks.Batch != nil {
			c.cfg.Hooks.Batch(res)
		}
		if err == nil {
			if held {
				held = false
				c.release(b)
				if c.held.Add(-1) == 0 {
					c.log.Info("handler recovered", "attempts", attempt)
				}
			}
			if err := s.settle(b); err != nil {
				if s.deadCtx.Err() != nil {
					return fmt.Errorf("settle batch: %w", s.cause())
				}
				return fmt.Errorf("settle batch: %w", err)
			}
			return nil
		}

		if s.deadCtx.Err() != nil {
			return fmt.Errorf("handler: %w (channel closed meanwhile: %w)", err, s.cause())
		}
		if ctx.Err() != nil {
			return nil // stopping: no retry
		}
		delay := c.cfg.Backoff.Delay(attempt)
		c.hold(b, first, attempt, err)
		lvl := slog.LevelDebug
		if !held {
			held = true
			if c.held.Add(1) == 1 { // the first batch held: the others are alike
				lvl = slog.LevelWarn
			}
		}
		c.log.Log(ctx, lvl, "handler failed; holding the batch to retry it",
			"err", err, "batch", len(b.Deliveries), "attempt", attempt, "retry_in", delay)

		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-s.deadCtx.Done():
			t.Stop()
			return s.cause()
		}
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
