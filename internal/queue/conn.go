package queue

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// dialTimeout bounds the TCP connect and the AMQP handshake.
	dialTimeout = 5 * time.Second
	// closeTimeout bounds connection.close, so a broker that stopped
	// answering cannot stall a shutdown.
	closeTimeout = time.Second
)

// Hooks let the caller observe the consumer and publisher, for metrics,
// without this package choosing a metrics library. Every field is optional.
// Hooks run on the goroutine doing the work, so they must be quick.
type Hooks struct {
	// Connection is called with true when a connection is up (the consumer:
	// consuming) and with false when it is lost, once per change.
	Connection func(up bool)
	// Batch is called by the Consumer after every handler call.
	Batch func(BatchResult)
	// Paused is called when the Consumer stops consuming because the
	// bytes it holds passed ConsumerConfig.MaxHeldBytes.
	Paused func()
	// Held is called with the bytes of the deliveries held (received and
	// not settled) whenever they change.
	Held func(bytes int64)
	// Publish is called by the Publisher after every Publish call.
	Publish func(PublishResult)
}

// BatchResult describes one handler call.
type BatchResult struct {
	Size     int           // deliveries in the batch
	Attempt  int           // 1 for the first call on this batch
	Acked    int           // deliveries acked (0 when Err is set)
	Requeued int           // deliveries nacked with requeue
	Took     time.Duration // time spent in the handler
	Err      error         // the handler's error; the batch is held and retried
}

// PublishResult describes one Publish call.
type PublishResult struct {
	Messages int
	Took     time.Duration // until every confirm arrived, or the failure
	Err      error
}

// validateURL checks the URL once, up front, so later dial errors cannot
// carry it: net/url quotes the whole URL, password included, in its errors.
func validateURL(raw string) error {
	if raw == "" {
		return errors.New("AMQP URL is empty")
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the same failure, without the URL text
		}
		return fmt.Errorf("invalid AMQP URL %s: %w", redactURL(raw), err)
	}
	return nil
}

// redactURL returns the URL fit for logs: scheme, host and vhost only. The
// user info goes entirely, user name included (docs/configuration.md: logged
// URLs lose their user info), and so do the query and fragment, which
// RabbitMQ's URI scheme leaves free for client settings.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	clean := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return clean.String()
}

// readBuffer is what one read of a connection's socket may take. amqp091
// reads frames through a bufio.Reader of 4 KiB, a system call for every few
// messages of a busy consumer; behind this, one for every few dozen.
const readBuffer = 64 << 10

// readBuffered is a connection whose reads go through a larger buffer; the
// rest (deadlines, which amqp091's heartbeats set, and writes) is the
// connection's own.
type readBuffered struct {
	net.Conn
	r *bufio.Reader
}

func (c *readBuffered) Read(p []byte) (int, error) { return c.r.Read(p) }

// Dial opens a named connection, as the Consumer and the Publisher do:
// tools/bench's bare consumer uses it too, so that its ceiling reads the
// socket as Klaxon does. ctx bounds the TCP connect and the handshake; the
// name shows in the broker's connection list, which is how an operator (or
// a test) finds and closes one connection.
func Dial(ctx context.Context, rawURL, name string) (*amqp.Connection, error) {
	stop := func() bool { return true }
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	cfg := amqp.Config{
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: dialTimeout}
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The handshake is not context-aware: bound it by a deadline, and
			// by ctx through an expired deadline. amqp091 clears the deadline
			// once the connection is open.
			if err := nc.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
				_ = nc.Close()
				return nil, err
			}
			stop = context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
			return &readBuffered{Conn: nc, r: bufio.NewReaderSize(nc, readBuffer)}, nil
		},
	}
	conn, err := amqp.DialConfig(rawURL, cfg)
	stopped := stop()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if !stopped || ctx.Err() != nil {
		// ctx ended around the handshake; the socket may carry an expired deadline.
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		return nil, ctx.Err()
	}
	return conn, nil
}

// closeOnCancel closes conn if ctx ends before release is called, so that a
// blocking RPC (declare, qos, consume) returns instead of outliving ctx.
// release waits for a close already under way.
func closeOnCancel(ctx context.Context, conn *amqp.Connection) (release func()) {
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
	})
	return func() {
		if !stop() {
			<-done
		}
	}
}

// declareQueue declares a durable queue. A queue that already exists with
// other arguments (Hawk's `notifier` is a plain classic queue) makes the
// broker answer PRECONDITION_FAILED; that queue is then used as it is, after
// a passive declare confirms it exists, because refusing to start over an
// argument mismatch would help no one. When args bound the queue, the
// warning says how to bound the existing one (boundsAdvice).
func declareQueue(conn *amqp.Connection, log *slog.Logger, name string, args amqp.Table) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel to declare queue %q: %w", name, err)
	}
	_, err = ch.QueueDeclare(name, true, false, false, false, args)
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.PreconditionFailed {
		_ = ch.Close()
		if err != nil {
			return fmt.Errorf("declare queue %q: %w", name, err)
		}
		return nil
	}
	// The failed declare closed that channel.
	ch, err = conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel to inspect queue %q: %w", name, err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(name, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %q passively after %v: %w", name, aerr, err)
	}
	attrs := []any{"queue", name, "wanted_args", fmt.Sprint(args), "broker_said", aerr.Reason}
	if strings.Contains(aerr.Reason, "'x-queue-type'") {
		// The broker names the first argument that differs; the type is
		// the one no policy can change.
		attrs = append(attrs, "what_to_do", "a queue's type cannot change: it keeps working as it is; "+
			"to change its type, stop the workers, let the queue empty, delete it, and start them: "+
			"Klaxon declares it anew with KLAXON_QUEUE_TYPE")
	} else if advice := boundsAdvice(name, args); advice != "" {
		attrs = append(attrs, "what_to_do", advice)
	}
	log.Warn("queue exists with other arguments; using it as it is", attrs...)
	return nil
}

// declareConsumed makes sure the queue a consumer reads exists. An existing
// queue is used as it is, with no declaration that could differ from how it
// was made: the incoming queue may be Hawk's classic `notifier` or a quorum
// queue an operator made, and its type cannot change. A passive declare
// tells whether it exists (its NOT_FOUND closes the channel, hence a channel
// of its own); only a missing queue is declared, with args. Two workers
// creating it at once both succeed, and one that loses a race to another
// type falls back to declareQueue's use-as-is.
func declareConsumed(conn *amqp.Connection, log *slog.Logger, name string, args amqp.Table) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel to inspect queue %q: %w", name, err)
	}
	_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	var aerr *amqp.Error
	if err == nil || !errors.As(err, &aerr) || aerr.Code != amqp.NotFound {
		_ = ch.Close()
		if err != nil {
			return fmt.Errorf("inspect queue %q: %w", name, err)
		}
		return nil
	}
	if err := declareQueue(conn, log, name, args); err != nil {
		return err
	}
	log.Info("declared the missing queue", "queue", name, "args", fmt.Sprint(args))
	return nil
}

// connState tracks whether a component is connected, calls the hook and logs
// once per change: a broker that stays down for an hour is one log line,
// then a reminder a minute with the count of failed attempts, not a line per
// retry. Errors are not compared: theirs name a new local port every time.
type connState struct {
	log    *slog.Logger
	hook   func(bool)
	remind time.Duration
	up     atomic.Bool

	mu       sync.Mutex
	failures int       // failed attempts since the last connection
	logged   time.Time // when a failure was last logged
}

func newConnState(log *slog.Logger, hook func(bool)) *connState {
	return &connState{log: log, hook: hook, remind: time.Minute}
}

// setUp records a working connection.
func (s *connState) setUp() {
	s.mu.Lock()
	defer s.mu.Unlock()
	failures := s.failures
	s.failures = 0
	if s.up.Swap(true) {
		return
	}
	if failures > 0 {
		s.log.Info("rabbitmq connected", "failed_attempts", failures)
	} else {
		s.log.Info("rabbitmq connected")
	}
	if s.hook != nil {
		s.hook(true)
	}
}

// setDown records a lost connection or a failed attempt; err is nil for a
// deliberate close.
func (s *connState) setDown(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	wasUp := s.up.Swap(false)
	switch {
	case wasUp && err == nil:
		s.log.Info("rabbitmq connection closed")
	case wasUp:
		s.log.Warn("rabbitmq connection lost", "err", err)
	case err == nil:
	default:
		s.failures++
		switch now := time.Now(); {
		case s.failures == 1:
			s.log.Warn("rabbitmq unavailable", "err", err)
			s.logged = now
		case now.Sub(s.logged) >= s.remind:
			s.log.Warn("rabbitmq still unavailable", "failed_attempts", s.failures, "err", err)
			s.logged = now
		}
	}
	if wasUp && s.hook != nil {
		s.hook(false)
	}
}
