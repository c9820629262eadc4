package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Errors Publish wraps. Whatever the error, none of the call's messages may be
// taken as stored: the caller keeps (does not ack) what led to them, and the
// redelivery that follows publishes them again — at least once.
var (
	// ErrNacked means the broker refused some of the messages.
	ErrNacked = errors.New("broker nacked the message")
	// ErrUnroutable means no queue took some of the messages (for the default
	// exchange: the queue does not exist).
	ErrUnroutable = errors.New("message unroutable")
	// ErrClosed means the Publisher was closed.
	ErrClosed = errors.New("publisher closed")
)

// TooLargeError means the broker refused a message for its size (RabbitMQ's
// max_message_size): it closes the channel, failing the confirms of every
// message of the call not yet confirmed. Publishing the same messages again
// fails the same way, so a caller that retries until they go would hold
// them forever; it must make them smaller or set the big ones aside, one by
// one: those of more than Max bytes of body.
type TooLargeError struct {
	Size int // the refused message's bytes, as the broker counted them
	Max  int // the broker's max_message_size
	err  error
}

func (e *TooLargeError) Error() string {
	msg := fmt.Sprintf("broker refused a message of %d bytes, over its max_message_size of %d", e.Size, e.Max)
	if e.err != nil {
		msg += ": " + e.err.Error()
	}
	return msg
}

func (e *TooLargeError) Unwrap() error { return e.err }

// tooLargeReason is RabbitMQ's reason for refusing a message for its size
// (406 PRECONDITION_FAILED), the same from 3.8 to 4.x.
var tooLargeReason = regexp.MustCompile(`message size (\d+) is larger than configured max size (\d+)`)

// tooLarge returns the TooLargeError that err (a channel's close reason)
// stands for, or nil.
func tooLarge(err error) *TooLargeError {
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.PreconditionFailed {
		return nil
	}
	m := tooLargeReason.FindStringSubmatch(aerr.Reason)
	if m == nil {
		return nil
	}
	size, err1 := strconv.Atoi(m[1])
	most, err2 := strconv.Atoi(m[2])
	if err1 != nil || err2 != nil {
		return nil
	}
	return &TooLargeError{Size: size, Max: most, err: aerr}
}

// PublisherConfig configures a Publisher. Zero values take the defaults shown.
type PublisherConfig struct {
	URL string // AMQP URL; required
	// ConnectionName is shown in the broker's connection list [klaxon-publisher].
	ConnectionName string
	// Backoff spaces reconnect attempts [100 ms … 10 s].
	Backoff Backoff
	// MaxIdleChannels is how many confirm-mode channels are kept open for
	// reuse between calls [16]. More concurrent calls open more channels,
	// up to MaxChannels [64]; past that a call waits for one.
	MaxIdleChannels int
	MaxChannels     int
	// QueueType is the type of the queues Declare creates, unless their
	// args name one [Classic]. An existing queue of another type is used as
	// it is, with a warning.
	QueueType Type
	Logger    *slog.Logger // [slog.Default()]
	Hooks     Hooks
}

// Message is one message to publish. It is always sent persistent.
type Message struct {
	// Exchange is "" for the default exchange, where RoutingKey names the queue.
	Exchange        string
	RoutingKey      string
	Body            []byte
	Headers         amqp.Table
	MessageID       string
	ContentType     string
	ContentEncoding string
	Timestamp       time.Time
	// Expiration, when positive, is the message's own TTL (whole ms): on a
	// delay queue it comes out after this, sooner than the queue's TTL,
	// once it reaches the queue's head.
	Expiration time.Duration
}

func (m Message) publishing() amqp.Publishing {
	return amqp.Publishing{
		Headers:         m.Headers,
		ContentType:     m.ContentType,
		ContentEncoding: m.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		MessageId:       m.MessageID,
		Timestamp:       m.Timestamp,
		Expiration:      expiration(m.Expiration),
		Body:            m.Body,
	}
}

// expiration is the AMQP expiration property for d: "" for none.
func expiration(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}

// Publisher publishes with publisher confirms over one connection that it
// re-establishes when lost. It is safe for concurrent use. Create it with
// NewPublisher and Close it when done.
type Publisher struct {
	cfg   PublisherConfig
	log   *slog.Logger
	state *connState

	life     context.Context // cancelled by Close, to cut short waits for a connection
	shutdown context.CancelFunc

	// sem guards the fields below; a channel rather than a mutex so that
	// waiting for it (behind a dial) honours ctx.
	sem      chan struct{}
	cur      *pubConn
	failures int
	retryAt  time.Time
	lastErr  error
	queues   map[string]amqp.Table // declared through Declare; redeclared on every connection
	closed   bool
}

// NewPublisher checks cfg and fills in its defaults. It does not connect:
// the first call that needs the broker does.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := validateURL(cfg.URL); err != nil {
		return nil, err
	}
	if cfg.ConnectionName == "" {
		cfg.ConnectionName = "klaxon-publisher"
	}
	cfg.Backoff = cfg.Backoff.withDefaults()
	if cfg.MaxChannels <= 0 {
		cfg.MaxChannels = 64
	}
	if cfg.MaxIdleChannels <= 0 {
		cfg.MaxIdleChannels = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("component", "amqp-publisher", "url", redactURL(cfg.URL))
	life, shutdown := context.WithCancel(context.Background())
	return &Publisher{
		cfg:      cfg,
		log:      log,
		state:    newConnState(log, cfg.Hooks.Connection),
		life:     life,
		shutdown: shutdown,
		sem:      make(chan struct{}, 1),
		queues:   make(map[string]amqp.Table),
	}, nil
}

// Connected reports whether the Publisher holds an open connection, for /readyz.
func (p *Publisher) Connected() bool { return p.state.up.Load() }

// Publish sends msgs, all of them before waiting, and returns once the broker
// has confirmed every one: nil means each message is stored in a queue. It
// returns an error wrapping ErrNacked or ErrUnroutable when the broker
// refused or could not route some, amqp.ErrClosed or another connection
// error when the connection dropped before every confirm arrived, and
// ctx.Err() when ctx ended first. Messages are never retried here: the
// caller's redelivery is the retry.
//
// Without a connection, Publish connects first, waiting out the reconnect
// backoff if a recent attempt failed, for as long as ctx allows. While the
// broker blocks the connection (flow control: a memory or disk alarm), it
// waits for the block to lift, for as long as ctx allows, writing nothing.
func (p *Publisher) Publish(ctx context.Context, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	start := time.Now()
	err := p.publish(ctx, msgs)
	if p.cfg.Hooks.Publish != nil {
		p.cfg.Hooks.Publish(PublishResult{Messages: len(msgs), Took: time.Since(start), Err: err})
	}
	return err
}

func (p *Publisher) publish(ctx context.Context, msgs []Message) error {
	pc, err := p.connection(ctx)
	if err != nil {
		return err
	}
	if err := pc.waitUnblocked(ctx); err != nil {
		return err
	}
	var returned []amqp.Return // read only once f has returned
	err = pc.do(ctx, func() error {
		select {
		case pc.open <- struct{}{}:
			defer func() { <-pc.open }()
		case <-ctx.Done():
			return ctx.Err()
		}
		ch, err := pc.acquire()
		if err != nil {
			return fmt.Errorf("open publishing channel: %w", err)
		}
		var reusable bool
		returned, reusable, err = ch.publish(ctx, msgs)
		pc.release(ch, reusable)
		return err
	})
	if errors.Is(err, ErrUnroutable) {
		p.redeclare(ctx, returned)
	}
	return err
}

// Declare declares a durable queue with args (see declareQueue for a queue
// that exists with other arguments) and remembers it: it is declared again
// on every new connection and whenever a publish to it comes back
// unroutable. Use it for `<queue>.dead`, delivery and retry queues. Like
// Publish, it connects first if needed.
func (p *Publisher) Declare(ctx context.Context, name string, args amqp.Table) error {
	args = p.cfg.QueueType.with(args)
	pc, err := p.connection(ctx)
	if err != nil {
		return err
	}
	if err := pc.do(ctx, func() error { return declareQueue(pc.conn, p.log, name, args) }); err != nil {
		return err
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.queues[name] = args
	<-p.sem
	return nil
}

// DeclareDelay declares a retry queue: a message published to `name` waits
// there for ttl, then the broker moves it to the queue `target` (dead
// lettering through the default exchange). A queue has one TTL, so each
// retry delay needs its own queue (per-message TTLs would expire only at the
// head of the queue, holding short delays behind long ones).
//
// It is a quorum queue with at-least-once dead lettering: a classic queue
// dead-letters at most once, and a message expiring while the broker shuts
// down is lost there, with the job it carried. At-least-once needs the
// reject-publish overflow; a message moved twice is a job handled twice,
// which the deliverer's claims make harmless.
func (p *Publisher) DeclareDelay(ctx context.Context, name, target string, ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("delay queue %q: ttl %s is below 1 ms", name, ttl)
	}
	return p.Declare(ctx, name, amqp.Table{
		"x-queue-type":              "quorum",
		"x-message-ttl":             ttl.Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": target,
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
	})
}

// Depth is how many messages are ready in the queue name, for metrics. A
// passive declare on a channel of its own: a missing queue closes only it.
func (p *Publisher) Depth(ctx context.Context, name string) (int, error) {
	pc, err := p.connection(ctx)
	if err != nil {
		return 0, err
	}
	var n int // read only once f has returned
	err = pc.do(ctx, func() error {
		ch, err := pc.conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("inspect queue %s: %w", name, err)
		}
		n = q.Messages
		return nil
	})
	if err != nil {
		return 0, err // f may still be running: n is not to be read
	}
	return n, nil
}

// Delete deletes the queues with their messages, for tools and tests that
// clean up after themselves; a queue that does not exist is not an error. It
// forgets the queues Declare remembered, or a new connection would bring them
// back. It tries every name and joins the failures.
func (p *Publisher) Delete(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, name := range names {
		delete(p.queues, name)
	}
	<-p.sem
	pc, err := p.connection(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		// A channel each: a failed delete closes the one it ran on.
		ch, err := pc.conn.Channel()
		if err != nil {
			errs = append(errs, fmt.Errorf("open channel to delete queue %s: %w", name, err))
			break // the connection is gone
		}
		_, err = ch.QueueDelete(name, false, false, false)
		_ = ch.Close()
		var aerr *amqp.Error
		if err != nil && !(errors.As(err, &aerr) && aerr.Code == amqp.NotFound) {
			errs = append(errs, fmt.Errorf("delete queue %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Close closes the connection. Calls in flight fail; later calls return ErrClosed.
func (p *Publisher) Close() error {
	p.shutdown()
	p.sem <- struct{}{} // quick: every wait holding sem watches p.life
	defer func() { <-p.sem }()
	p.closed = true
	if p.cur != nil {
		p.cur.close()
		p.cur = nil
	}
	return nil
}

// connection returns the open connection, dialing when there is none.
func (p *Publisher) connection(ctx context.Context) (*pubConn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.life, cancel)
	defer stop()

	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, p.ctxErr(ctx)
	}
	defer func() { <-p.sem }()

	for {
		if p.closed {
			return nil, ErrClosed
		}
		if p.cur != nil {
			if !p.cur.conn.IsClosed() {
				return p.cur, nil
			}
			p.cur.close() // reaps its watcher, which recorded the loss
			p.cur = nil
		}
		if wait := time.Until(p.retryAt); wait > 0 && !sleep(ctx, wait) {
			return nil, fmt.Errorf("reconnect after %w: %w", p.lastErr, p.ctxErr(ctx))
		}
		conn, err := Dial(ctx, p.cfg.URL, p.cfg.ConnectionName)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("connect: %w", p.ctxErr(ctx))
			}
			p.failures++
			p.retryAt = time.Now().Add(p.cfg.Backoff.Delay(p.failures))
			p.lastErr = fmt.Errorf("connect: %w", err)
			p.state.setDown(p.lastErr)
			continue
		}
		p.failures, p.retryAt, p.lastErr = 0, time.Time{}, nil
		p.cur = newPubConn(conn, p.cfg.MaxIdleChannels, p.cfg.MaxChannels, p.state)
		for _, name := range slices.Sorted(maps.Keys(p.queues)) {
			if err := declareQueue(conn, p.log, name, p.queues[name]); err != nil {
				p.log.Warn("redeclare queue on new connection", "queue", name, "err", err)
			}
		}
		p.state.setUp()
		return p.cur, nil
	}
}

// ctxErr tells a closed Publisher from the caller's own ctx ending.
func (p *Publisher) ctxErr(ctx context.Context) error {
	if p.life.Err() != nil {
		return ErrClosed
	}
	return ctx.Err()
}

// redeclare declares again the remembered queues that returned messages
// were addressed to (through the default exchange), so that the caller's
// retry finds them.
func (p *Publisher) redeclare(ctx context.Context, returned []amqp.Return) {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-p.sem }()
	if p.cur == nil {
		return
	}
	done := map[string]bool{}
	for _, r := range returned {
		args, known := p.queues[r.RoutingKey]
		if r.Exchange != "" || !known || done[r.RoutingKey] {
			continue
		}
		done[r.RoutingKey] = true
		pc := p.cur
		if err := pc.do(ctx, func() error { return declareQueue(pc.conn, p.log, r.RoutingKey, args) }); err != nil {
			p.log.Warn("redeclare missing queue", "queue", r.RoutingKey, "err", err)
			continue
		}
		p.log.Warn("queue was missing; declared it again", "queue", r.RoutingKey)
	}
}
