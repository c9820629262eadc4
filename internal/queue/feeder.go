package queue

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
)

// slowStart is the prefetch a feeder starts with: what the broker may
// push before the feeder has seen how big messages are.
const slowStart = 1

// feeder sits between a session's channel and its batches: it hands the
// collector everything received since the collector last took, in one
// slice, so a batch holds all that is ready (one delivery at a time, an
// unbuffered hand-off shows the collector only the one the feeder is
// offering, and a batch closes with one or two though dozens wait). With
// a budget (ConsumerConfig.MaxHeldBytes) it also bounds the bytes the
// session holds. RabbitMQ counts prefetch in messages and amqp091 buffers
// whatever the broker pushes, so the one brake there is on bytes is to
// stop consuming: the feeder counts the bytes of every delivery received
// and not yet settled, and
//
//   - cancels its consumer once they pass the budget, and consumes again,
//     on the same channel, once they fall to half of it;
//   - sizes each consumer's prefetch so that the largest message it saw
//     lately, times the prefetch, fits half the budget; starts at 1 and
//     doubles, a consumer at a time, while messages stay small.
//
// One goroutine (run) owns the consumer: it alone cancels, sets the
// prefetch and consumes, and it consumes again only once the cancelled
// consumer's deliveries channel is closed, that is once every delivery the
// broker sent it is in hand. The deliveries it passes on keep the broker's
// order, so tags only grow and a multiple ack covers only what was handled.
// Deliveries of a cancelled consumer stay unacked on the channel and are
// settled as usual; a new connection starts a new feeder from nothing.
type feeder struct {
	ch          *amqp.Channel
	queue, name string
	budget      int64 // 0: no bound on bytes
	maxPrefetch int
	log         *slog.Logger
	hooks       Hooks // Paused and Held; either may be nil

	dead  <-chan struct{}      // closed when the channel has closed
	held  atomic.Int64         // bytes received and not settled
	freed chan struct{}        // a settle lowered held; 1-buffered
	halt  chan struct{}        // closed by stopConsuming
	out   chan []amqp.Delivery // all received since the last take, in tag order
	// failed is why consuming failed, set before out closes. Atomic: the
	// session may look at it on the channel's close, which can come first
	// (the connection cut) and orders nothing with the feeder's write.
	failed atomic.Pointer[error]

	// Owned by run.
	prefetch int
	tag      string
	n        int   // deliveries the current consumer gave
	largest  int64 // the largest of them, in bytes
	seq      int
}

func newFeeder(ch *amqp.Channel, dead <-chan struct{}, queue, name string, budget int64, maxPrefetch int, log *slog.Logger, hooks Hooks) *feeder {
	prefetch := maxPrefetch // without a budget, all of it at once
	if budget > 0 {
		prefetch = min(slowStart, maxPrefetch)
	}
	return &feeder{
		ch: ch, dead: dead, queue: queue, name: name, budget: budget, maxPrefetch: maxPrefetch, log: log, hooks: hooks,
		freed: make(chan struct{}, 1), halt: make(chan struct{}), out: make(chan []amqp.Delivery),
		prefetch: prefetch,
	}
}

// start consumes with the first prefetch; run takes it from there.
func (f *feeder) start() (<-chan []amqp.Delivery, error) {
	src, err := f.consume()
	if err != nil {
		return nil, err
	}
	go f.run(src)
	return f.out, nil
}

// release is called once bytes of deliveries were acked or nacked.
func (f *feeder) release(bytes int64) {
	if bytes == 0 {
		return
	}
	held := f.held.Add(-bytes)
	if f.hooks.Held != nil {
		f.hooks.Held(held)
	}
	select {
	case f.freed <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// err is why consuming failed, or nil.
func (f *feeder) err() error {
	if p := f.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// stopConsuming asks run to cancel the consumer (without waiting for the
// broker) and close out once what it holds is passed on.
func (f *feeder) stopConsuming() { close(f.halt) }

func (f *feeder) consume() (<-chan amqp.Delivery, error) {
	if err := f.ch.Qos(f.prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("set prefetch %d: %w", f.prefetch, err)
	}
	f.seq++
	f.tag = fmt.Sprintf("%s-%d", f.name, f.seq)
	f.n, f.largest = 0, 0
	src, err := f.ch.Consume(f.queue, f.tag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume queue %q: %w", f.queue, err)
	}
	return src, nil
}

// fit is the largest prefetch at which size-byte messages fill half the
// budget, within 1 and the configured prefetch; without a budget, the
// configured prefetch.
func (f *feeder) fit(size int64) int {
	if f.budget <= 0 {
		return f.maxPrefetch
	}
	return int(max(1, min(int64(f.maxPrefetch), f.budget/2/max(size, 1))))
}

// run passes deliveries on from src, and from each consumer after it,
// until the channel or the consumer ends (out closes with f.failed set) or
// stopConsuming (out closes once src and the queue are drained).
func (f *feeder) run(src <-chan amqp.Delivery) {
	defer close(f.out)
	var (
		queue      []amqp.Delivery // received, not passed on yet
		passed     int             // how many the last queue passed on held
		cancelled  bool            // src is being drained after our cancel
		next       int             // the prefetch of the consumer after src
		stopping   bool
		stopWanted = f.halt
	)
	// fail ends consuming on this channel for good: closing it makes sure
	// the session sees it die, and reconnects.
	fail := func(err error) {
		f.failed.Store(&err)
		_ = f.ch.Close()
		src, stopping, queue = nil, true, nil
	}
	cancel := func(prefetch int) {
		if err := f.ch.Cancel(f.tag, false); err != nil {
			fail(fmt.Errorf("cancel consumer: %w", err))
			return
		}
		cancelled, next = true, prefetch
	}
	for {
		if src == nil && !stopping && f.held.Load() <= f.budget/2 {
			// Paused, or between consumers: the cancelled one is drained,
			// and what it sent after the cancel counts too.
			f.prefetch = min(next, f.fit(f.largest))
			s, err := f.consume()
			if err != nil {
				fail(err)
			} else {
				src, cancelled = s, false
			}
		}
		if src == nil && stopping && len(queue) == 0 {
			return
		}
		var out chan []amqp.Delivery
		if len(queue) > 0 {
			out = f.out
		}
		select {
		case d, ok := <-src:
			if !ok {
				if !cancelled {
					// The channel closed, or the broker cancelled: the
					// session ends, and the broker redelivers what it
					// holds, as it does without a feeder.
					return
				}
				src = nil
				continue
			}
			size := int64(len(d.Body))
			held := f.held.Add(size)
			if f.hooks.Held != nil {
				f.hooks.Held(held)
			}
			f.n++
			f.largest = max(f.largest, size)
			if queue == nil {
				// Room for as many as last time: a Delivery is a few
				// hundred bytes, and growing the slice from one copied
				// each of them several times.
				queue = make([]amqp.Delivery, 0, max(passed, 16))
			}
			queue = append(queue, d)
			switch {
			case cancelled:
			case f.budget > 0 && held > f.budget:
				f.log.Debug("consumer paused: the messages held are over the budget",
					"held_bytes", held, "budget_bytes", f.budget, "prefetch", f.prefetch, "largest_bytes", f.largest)
				if f.hooks.Paused != nil {
					f.hooks.Paused()
				}
				cancel(min(f.prefetch, f.fit(f.largest)))
			case f.n >= f.prefetch && f.prefetch < f.maxPrefetch && f.fit(f.largest) > f.prefetch:
				cancel(min(2*f.prefetch, f.fit(f.largest))) // slow start
			}
		case out <- queue:
			passed, queue = len(queue), nil // the collector's now
		case <-f.freed:
		case <-f.dead:
			// Paused, or the session gone without a stop: nothing reads
			// out any more, and what is held comes again from the broker.
			return
		case <-stopWanted:
			stopWanted, stopping = nil, true
			if src != nil && !cancelled {
				// noWait: what crosses the cancel is dropped here and
				// requeued when the channel closes (session.stop).
				if err := f.ch.Cancel(f.tag, true); err != nil {
					f.failed.Store(&err)
					src = nil
				}
				cancelled = true
			}
		}
	}
}
