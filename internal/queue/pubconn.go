package queue

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// pubConn is one connection and its idle confirm-mode channels.
type pubConn struct {
	conn    *amqp.Connection
	maxIdle int
	// open holds a token for each channel in use by a call: hundreds of
	// concurrent calls (the deliverer's jobs) wait for one of a few
	// channels rather than each open and close one of its own, two round
	// trips to the broker more for every message.
	open       chan struct{}
	watcherEnd chan struct{}
	work       sync.WaitGroup // calls to the broker that do runs; close waits for them

	mu      sync.Mutex
	idle    []*pubChannel
	closing bool          // close has closed conn: no new work goroutines
	blocked chan struct{} // non-nil while the broker blocks the connection; closed when it lifts
	reason  string        // the broker's reason for the block
}

func newPubConn(conn *amqp.Connection, maxIdle, maxOpen int, state *connState) *pubConn {
	pc := &pubConn{conn: conn, maxIdle: maxIdle, open: make(chan struct{}, max(maxOpen, maxIdle)), watcherEnd: make(chan struct{})}
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 1))
	go func() {
		defer close(pc.watcherEnd)
		defer pc.setBlocked(state.log, amqp.Blocking{}) // a closed connection blocks no one
		for {
			select {
			case b, ok := <-blocks:
				if !ok {
					blocks = nil
					continue
				}
				pc.setBlocked(state.log, b)
			case e, ok := <-closes:
				// Report a loss when it happens, not at the next Publish, so
				// Connected (and /readyz) stays true to the facts.
				if ok && e != nil {
					state.setDown(fmt.Errorf("connection closed: %w", e))
				} else {
					state.setDown(nil)
				}
				return
			}
		}
	}()
	return pc
}

// setBlocked records connection.blocked or connection.unblocked.
func (pc *pubConn) setBlocked(log *slog.Logger, b amqp.Blocking) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	switch {
	case b.Active && pc.blocked == nil:
		pc.blocked, pc.reason = make(chan struct{}), b.Reason
		log.Warn("rabbitmq blocks publishing (flow control)", "reason", b.Reason)
	case !b.Active && pc.blocked != nil:
		close(pc.blocked)
		pc.blocked, pc.reason = nil, ""
		log.Info("rabbitmq unblocked publishing")
	}
}

// waitUnblocked waits while the broker blocks the connection. A blocked
// connection is not read by the broker: what is written meanwhile would sit
// in socket buffers, its confirms and close-oks due only once the alarm
// clears, and the caller, given up, would write it all again.
func (pc *pubConn) waitUnblocked(ctx context.Context) error {
	pc.mu.Lock()
	lifted, reason := pc.blocked, pc.reason
	pc.mu.Unlock()
	if lifted == nil {
		return nil
	}
	select {
	case <-lifted:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rabbitmq blocks publishing (%s): %w", reason, ctx.Err())
	}
}

// do runs f, which talks to the broker, and returns its error, or ctx's if
// ctx ends first. amqp091's RPCs, writes and channel closes wait for the
// broker without a ctx; a broker that stops answering (overloaded, blocking
// the connection, partitioned without a reset) would hold the caller until
// heartbeats or the alarm end, if ever. So f runs on a goroutine of its own
// that goes on, when the caller has left, until the broker answers or close
// closes the connection; close waits for it.
func (pc *pubConn) do(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	pc.mu.Lock()
	if pc.closing { // conn is closed: f fails at once
		pc.mu.Unlock()
		return f()
	}
	pc.work.Add(1)
	pc.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		defer pc.work.Done()
		done <- f()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("rabbitmq did not answer in time: %w", ctx.Err())
	}
}

// close closes the connection and waits for its watcher and for every f
// that do left running, which the closed connection ends.
func (pc *pubConn) close() {
	_ = pc.conn.CloseDeadline(time.Now().Add(closeTimeout))
	pc.mu.Lock()
	pc.closing = true
	pc.mu.Unlock()
	pc.work.Wait()
	<-pc.watcherEnd
}

// acquire hands out a channel for the exclusive use of one Publish call, so
// that the returns and confirms seen on it are that call's alone.
func (pc *pubConn) acquire() (*pubChannel, error) {
	pc.mu.Lock()
	if n := len(pc.idle); n > 0 {
		ch := pc.idle[n-1]
		pc.idle = pc.idle[:n-1]
		pc.mu.Unlock()
		return ch, nil
	}
	pc.mu.Unlock()

	ch, err := pc.conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	// Buffered, and drained while waiting for confirms: amqp091 gives up on
	// a full listener after 5 s, which would lose a return.
	returns := ch.NotifyReturn(make(chan amqp.Return, 128))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	return &pubChannel{ch: ch, returns: returns, closes: closes}, nil
}

// release keeps ch for reuse when its state is clean (no confirm or return
// outstanding), and closes it otherwise.
func (pc *pubConn) release(ch *pubChannel, reusable bool) {
	if reusable && !ch.ch.IsClosed() {
		pc.mu.Lock()
		if len(pc.idle) < pc.maxIdle {
			pc.idle = append(pc.idle, ch)
			pc.mu.Unlock()
			return
		}
		pc.mu.Unlock()
	}
	_ = ch.ch.Close()
}

type pubChannel struct {
	ch      *amqp.Channel
	returns <-chan amqp.Return
	closes  <-chan *amqp.Error // why the broker closed it, e.g. 404 for a missing exchange
}

// closeReasonWait is the broker's reason for closing the channel, or
// amqp.ErrClosed. amqp091 marks a channel closed before it hands out the
// broker's reason, so the reason may be a moment behind a failed write: it
// waits for it up to reasonWait or ctx's end, whichever comes first.
func (pch *pubChannel) closeReasonWait(ctx context.Context) error {
	if !pch.ch.IsClosed() {
		return amqp.ErrClosed
	}
	t := time.NewTimer(reasonWait)
	defer t.Stop()
	select {
	case e, ok := <-pch.closes:
		if ok && e != nil {
			return e
		}
	case <-t.C:
	case <-ctx.Done():
	}
	return amqp.ErrClosed
}

// reasonWait bounds the wait for a closed channel's reason: it comes with
// the frame that closed the channel, handled at once.
const reasonWait = time.Second

// publish sends every message, then waits for every confirm. reusable
// reports whether every confirm arrived, leaving the channel clean.
func (pch *pubChannel) publish(ctx context.Context, msgs []Message) (returned []amqp.Return, reusable bool, err error) {
	confs := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		// mandatory: an unroutable message comes back instead of vanishing.
		dc, err := pch.ch.PublishWithDeferredConfirmWithContext(ctx, m.Exchange, m.RoutingKey, true, false, m.publishing())
		if err != nil {
			if tl := tooLarge(pch.closeReasonWait(ctx)); tl != nil {
				// The broker closed the channel for an earlier message.
				return nil, false, fmt.Errorf("publish to %s: %w", target(m.Exchange, m.RoutingKey), tl)
			}
			return nil, false, fmt.Errorf("publish to %s: %w", target(m.Exchange, m.RoutingKey), err)
		}
		confs = append(confs, dc)
	}

	returns := pch.returns
	for _, dc := range confs {
	wait:
		for {
			select {
			case <-dc.Done():
				break wait
			case r, ok := <-returns:
				if !ok {
					returns = nil // channel closed; its confirms are failing too
					continue
				}
				returned = append(returned, r)
			case <-ctx.Done():
				return returned, false, fmt.Errorf("wait for publisher confirms: %w", ctx.Err())
			}
		}
	}
	// The broker sends a message's basic.return before its basic.ack, and
	// amqp091 queues it before handling the ack: every return is here now.
	for returns != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			returned = append(returned, r)
		default:
			returns = nil
		}
	}

	nacked := 0
	for _, dc := range confs {
		if !dc.Acked() {
			nacked++
		}
	}
	switch {
	case nacked > 0 && pch.ch.IsClosed():
		// amqp091 fails outstanding confirms when the channel closes.
		reason := pch.closeReasonWait(ctx)
		if tl := tooLarge(reason); tl != nil {
			return returned, false, fmt.Errorf("%d of %d messages unconfirmed: %w", nacked, len(msgs), tl)
		}
		return returned, false, fmt.Errorf("%d of %d messages unconfirmed, channel closed: %w", nacked, len(msgs), reason)
	case nacked > 0:
		return returned, true, fmt.Errorf("%d of %d messages: %w", nacked, len(msgs), ErrNacked)
	case len(returned) > 0:
		r := returned[0]
		return returned, true, fmt.Errorf("%d of %d messages, first to %s (%d %s): %w",
			len(returned), len(msgs), target(r.Exchange, r.RoutingKey), r.ReplyCode, r.ReplyText, ErrUnroutable)
	}
	return nil, true, nil
}

func target(exchange, key string) string {
	if exchange == "" {
		return "queue " + strconv.Quote(key)
	}
	return fmt.Sprintf("exchange %q key %q", exchange, key)
}
