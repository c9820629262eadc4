package queue

import (
	"context"
	"fmt"
	mathrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one channel's consuming state. Everything here refers to that
// channel only; a new connection gets a new session.
type session struct {
	ch         *amqp.Channel
	tag        string
	deliveries <-chan []amqp.Delivery // the feeder's
	feeder     *feeder
	rest       []amqp.Delivery // taken from deliveries, not in a batch yet
	closes     chan *amqp.Error
	cancels    chan string // the broker cancelled the consumer (queue deleted)

	deadCtx    context.Context // done when the channel has closed
	markDead   context.CancelFunc
	closeErr   error // set before deadCtx is done
	watcherEnd chan struct{}

	timer *time.Timer

	// inflight holds the batches handed to the handler and not settled yet,
	// in tag order (the order they were collected in).
	mu       sync.Mutex
	inflight []*Batch
	inOrder  bool // ConsumerConfig.InOrder
}

func newSession(ch *amqp.Channel) *session {
	s := &session{
		ch:         ch,
		closes:     ch.NotifyClose(make(chan *amqp.Error, 1)),
		cancels:    ch.NotifyCancel(make(chan string, 1)),
		watcherEnd: make(chan struct{}),
	}
	s.deadCtx, s.markDead = context.WithCancel(context.Background())
	go func() {
		defer close(s.watcherEnd)
		// Sent on an abnormal close, closed without a value on a clean one;
		// either way the channel is done.
		e, ok := <-s.closes
		if ok && e != nil {
			s.closeErr = fmt.Errorf("channel closed: %w", e)
		} else {
			s.closeErr = amqp.ErrClosed
		}
		s.markDead()
	}()
	return s
}

// wait returns once the watcher has seen the channel close; the session's
// connection must be closing.
func (s *session) wait() { <-s.watcherEnd }

// cause says why the deliveries stopped. amqp091 reports a channel close or
// a broker-side cancel before it closes the deliveries, so one of the two is
// (about to be) ready. A channel that shuts down closes s.cancels too: that
// is no cancel, and the close is the cause.
func (s *session) cause() error {
	if err := s.feeder.err(); err != nil { // set before deliveries closed
		return err
	}
	select {
	case <-s.deadCtx.Done():
		return s.closeErr
	case tag, ok := <-s.cancels:
		if !ok {
			<-s.deadCtx.Done()
			return s.closeErr
		}
		return fmt.Errorf("broker cancelled consumer %s (queue deleted?)", tag)
	}
}

// collect returns the next batch: it waits for a first delivery, then takes
// whatever else is ready, waiting at most linger for a batch that is not
// full. It returns (nil, true) when ctx ends first, and alive=false when the
// deliveries stopped because the channel or the consumer is gone (the
// partial batch is dropped: the broker redelivers it).
func (s *session) collect(ctx context.Context, max int, linger time.Duration) (b *Batch, alive bool) {
	if len(s.rest) == 0 {
		select {
		case <-ctx.Done():
			return nil, true
		case ds, ok := <-s.deliveries:
			if !ok {
				return nil, false
			}
			s.rest = ds
		}
	}
	items := make([]Delivery, 0, min(max, len(s.rest)))
	// take moves into the batch what it has room for of s.rest.
	take := func() {
		n := min(max-len(items), len(s.rest))
		for _, d := range s.rest[:n] {
			items = append(items, fromAMQP(d))
		}
		clear(s.rest[:n])
		s.rest = s.rest[n:]
	}
	take()

	lingering := false
	for len(items) < max {
		select {
		case ds, ok := <-s.deliveries:
			if !ok {
				return nil, false
			}
			s.rest = ds
			take()
			continue
		default:
		}
		if linger < 0 {
			break
		}
		if !lingering {
			lingering = true
			if s.timer == nil {
				s.timer = time.NewTimer(linger)
			} else {
				s.timer.Reset(linger)
			}
		}
		select {
		case ds, ok := <-s.deliveries:
			if !ok {
				s.timer.Stop()
				return nil, false
			}
			s.rest = ds
			take()
			continue
		case <-s.timer.C:
		case <-ctx.Done():
			s.timer.Stop()
		}
		lingering = false
		break
	}
	if lingering {
		s.timer.Stop()
	}
	return &Batch{Deliveries: items, ID: mathrand.Int64N(1<<53-1) + 1}, true
}

// track records b as handed to the handler, not settled yet.
func (s *session) track(b *Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight = append(s.inflight, b)
}

// settle acks or requeues every delivery of b, as the handler decided. A
// multiple flag covers every unsettled tag up to its own, so it is used only
// when b is the oldest batch in flight: then every tag below b's is settled.
// A younger batch, done while an older one is still in the handler, settles
// each delivery on its own. The lock keeps each batch's frames together and
// in order with the next batch's decision.
func (s *session) settle(b *Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.inOrder {
		oldest := len(s.inflight) > 0 && s.inflight[0] == b
		return s.send(b, oldest)
	}
	// InOrder: settle the done batches at the head, oldest first, each
	// then the oldest in flight.
	b.done = true
	for len(s.inflight) > 0 && s.inflight[0].done {
		if err := s.send(s.inflight[0], true); err != nil {
			return err
		}
	}
	return nil
}

// send settles b, with multiple flags if it is the oldest batch in flight,
// and forgets it. s.mu is held.
func (s *session) send(b *Batch, oldest bool) error {
	for _, op := range planSettle(b.Deliveries, b.requeue, oldest) {
		var err error
		if op.ack {
			err = s.ch.Ack(op.tag, op.multiple)
		} else {
			err = s.ch.Nack(op.tag, op.multiple, true)
		}
		if err != nil {
			return err // the channel is gone: b stays, unsettled
		}
	}
	s.inflight = slices.DeleteFunc(s.inflight, func(x *Batch) bool { return x == b })
	var n int64
	for _, d := range b.Deliveries {
		n += int64(len(d.Body))
	}
	s.feeder.release(n)
	return nil
}

// stop ends consuming gracefully: it cancels the consumer, waits for the
// handlers in flight (wait, if not nil) to settle their own batches, then
// gives back b (if any), the batches the handlers left unsettled, and every
// delivery received but not handled, in one nack. The caller's deferred
// close then requeues whatever was still on the wire.
func (s *session) stop(b *Batch, wait func()) error {
	// noWait: deliveries that cross the cancel are dropped client-side and
	// requeued by the broker when the channel closes a moment later.
	var err error
	s.feeder.stopConsuming()
	var last uint64
	if b != nil {
		last = b.Deliveries[len(b.Deliveries)-1].DeliveryTag
	}
	if len(s.rest) > 0 {
		last = s.rest[len(s.rest)-1].DeliveryTag
	}
	for ds := range s.deliveries { // closes once the buffered deliveries are out
		last = ds[len(ds)-1].DeliveryTag
	}
	if wait != nil {
		// The nack below covers every unsettled tag up to last, which
		// would include the batches still in the handlers.
		wait()
	}
	s.mu.Lock()
	for _, ib := range slices.Clone(s.inflight) {
		if ib.done { // handled, waiting behind one given up on (InOrder)
			if err == nil {
				err = s.send(ib, false)
			}
			continue
		}
		for _, d := range ib.Deliveries { // given up on when ctx ended
			last = max(last, d.DeliveryTag)
		}
	}
	s.mu.Unlock()
	if err == nil && last > 0 {
		err = s.ch.Nack(last, true, true)
	}
	if err != nil {
		return fmt.Errorf("stop consuming: %w", err)
	}
	return nil
}

// settleOp is one basic.ack or basic.nack(requeue).
type settleOp struct {
	tag      uint64
	ack      bool
	multiple bool
}

// planSettle turns per-delivery outcomes into as few frames as possible: one
// multiple-ack or multiple-nack per run of equal outcomes, in tag order. A
// multiple flag covers every unsettled tag up to its own, which is exactly
// the run when earlier runs and batches are settled first: the caller says
// so with multiple. Without it, or should tags ever not be increasing, each
// delivery is settled on its own.
func planSettle(ds []Delivery, requeue []bool, multiple bool) []settleOp {
	requeued := func(i int) bool { return i < len(requeue) && requeue[i] }
	increasing := true
	for i := 1; i < len(ds); i++ {
		if ds[i].DeliveryTag <= ds[i-1].DeliveryTag {
			increasing = false
		}
	}
	if !multiple || !increasing {
		ops := make([]settleOp, len(ds))
		for j, d := range ds {
			ops[j] = settleOp{tag: d.DeliveryTag, ack: !requeued(j)}
		}
		return ops
	}
	var ops []settleOp
	for i := range ds {
		if i+1 < len(ds) && requeued(i+1) == requeued(i) {
			continue // the run goes on
		}
		ops = append(ops, settleOp{tag: ds[i].DeliveryTag, ack: !requeued(i), multiple: true})
	}
	return ops
}
