// Package deliverer sends notifications: it consumes delivery jobs
// (wire.Job), sends each firing exactly once per channel, retries what
// failed with backoff, gathers firings inside a channel's minPeriod into
// one digest, and sends the firings of one event that share a destination
// as one message (group.go).
//
// A job goes claim → send → settle: the claim (claims.go) makes one
// deliverer the sender of a message; send (send.go) tries the channel once,
// within the destination's pace and fairness bounds (fairness.go), and
// returns an outcome; settle records it, or schedules the retry
// (schedule.go), or sends the job to the failed queue. Digests (digest.go)
// snooze summaries (snooze.go) and quiet hours' recaps (quiet.go) are
// messages of their own that go the same way. The Lua scripts and their replies are in scripts.go.
package deliverer

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/pacing"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/seal"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// Publisher publishes messages and returns once the broker confirmed them.
type Publisher interface {
	Publish(ctx context.Context, msgs ...queue.Message) error
}

// Limiter paces messages to one destination under several sliding-window
// limits (pacing.Limiter): Reserve gives each message its turn.
type Limiter interface {
	Reserve(ctx context.Context, key string, limits ...pacing.Limit) (time.Duration, error)
}

// DefaultLimits are the providers' own rate limits per destination, so that
// a storm of firings is paced instead of refused: Telegram allows a chat
// about one message a second and a group twenty a minute; Slack an incoming
// webhook one a second, and Loop, Slack-compatible, is paced alike.
func DefaultLimits() map[string][]pacing.Limit {
	return map[string][]pacing.Limit{
		rules.Telegram: {pacing.PerSecond(1), pacing.PerMinute(20)},
		rules.Slack:    {pacing.PerSecond(1)},
		rules.Loop:     {pacing.PerSecond(1)},
	}
}

// Declarer declares the queues the deliverer needs.
type Declarer interface {
	Declare(ctx context.Context, name string, args amqp.Table) error
	DeclareDelay(ctx context.Context, name, target string, ttl time.Duration) error
}

// Config configures a Deliverer: what it works with, then its settings.
// Zero values take the defaults shown.
type Config struct {
	// Redis keeps claims, records, minPeriods, snoozes and the pace of
	// each destination; required.
	Redis redis.UniversalClient
	// Publisher publishes retries, flushes and failed notifications;
	// required.
	Publisher Publisher
	// Channels are the channels' notifiers, keyed by rules' channel names.
	Channels map[string]notify.Channel
	Logger   *slog.Logger     // [slog.Default()]
	Metrics  *metrics.Metrics // [metrics registered nowhere]

	Prefix string // namespace of Redis keys and queues [klaxon]
	// Queue is the delivery queue [<prefix>.deliveries], and BulkQueue
	// its bulk lane [<prefix>.deliveries.bulk] (evaluator.Lanes).
	Queue     string
	BulkQueue string
	// FailedQueue receives notifications that could not be sent, with the
	// reason in the x-klaxon-error header [<prefix>.failed].
	FailedQueue string
	// FailedBounds bound the failed queue, which nothing consumes: past
	// them its oldest messages go [queue.Bounds defaults].
	FailedBounds queue.Bounds
	// MaxAttempts is how many sends are tried before giving up [12: about
	// 17 minutes of exponential backoff].
	MaxAttempts int
	// SendTimeout bounds one send [30 s].
	SendTimeout time.Duration
	// Keep is how long a sent notification is remembered, so that a late
	// duplicate is not sent again [48 h].
	Keep time.Duration
	// Limits pace each destination of a channel, by channel name
	// [DefaultLimits]. A message over a limit waits; it is never dropped.
	Limits map[string][]pacing.Limit
	// DigestMaxFirings and DigestMaxBytes bound what one (rule, channel)
	// gathers during its minPeriod [500 firings, 1 MiB of jobs]: firings
	// past either are counted, and the digest says how many it left out.
	DigestMaxFirings int
	DigestMaxBytes   int
	// MaxSends is how many jobs the deliverer works on at once, each
	// a goroutine, sends in flight included [DefaultMaxSends]: the
	// delivery queue's prefetch. Within it, MaxSendsPerHost bound the sends
	// in flight to one host (host:port, or the SMTP server, the Bot API)
	// [16], four times that to one resolved address, MaxSendsPerProject
	// those of one project [32], and half of MaxSends those of one channel
	// (budgets.go). A job over any waits in the retry queues, so that no
	// host, project or provider can take the sends every project shares.
	MaxSends           int
	MaxSendsPerHost    int
	MaxSendsPerProject int
	// Resolver resolves hosts to their addresses for the address budget
	// [net.DefaultResolver].
	Resolver *net.Resolver
	// CircuitTimeouts consecutive timeouts of a host open its circuit [5]:
	// its jobs then wait CircuitOpen [30 s] in the retry queues, spending
	// no attempt, until one send probes it.
	CircuitTimeouts int
	CircuitOpen     time.Duration
	// WaitReplicas, when above 0, makes claims and records wait (Redis
	// WAIT) until that many replicas hold them, for at most WaitTimeout
	// [1 s]; fewer fails the job's batch, which is retried. Without it a
	// Sentinel failover may lose a claim or a "sent" record the old master
	// acknowledged, and the notification can be sent again. Single node and
	// Sentinel only: on a cluster client it is ignored, as in counter.
	WaitReplicas int
	WaitTimeout  time.Duration
	// Keys open the sealed endpoints of jobs (KLAXON_ENDPOINT_KEY); nil
	// opens clear ones only, and a sealed one fails for good.
	Keys *seal.Keys
	// Levels, when set, tells a quiet period's recap which of the groups
	// it lists are still above a threshold (quiet.go).
	Levels Levels
	// Now is the clock the deliverer decides by: when a job may go, when
	// a retry is due, a destination's circuit [time.Now]. Redis' own
	// clock keeps minPeriods, as it keeps counts. Tests set their own.
	Now func() time.Time
}

// Defaults of the digest bounds.
const (
	DefaultDigestMaxFirings = 500
	DefaultDigestMaxBytes   = 1 << 20
)

// Deliverer sends delivery jobs through the channels.
type Deliverer struct {
	cfg      Config
	channels map[string]notify.Channel
	rdb      redis.UniversalClient
	pub      Publisher
	limiter  Limiter
	log      *slog.Logger
	metrics  *metrics.Metrics
	scripts  scripts
	// instance tells this process' claim tokens from others' (claimToken).
	instance string
	// unrecorded holds the outcomes this process could not record (Redis
	// failed right after a send), by claim key: when the job comes back,
	// the outcome is recorded and the message is not sent again.
	unrecorded sync.Map // string → unrecorded
	// refused is which rules' refused endpoints were logged lately.
	refused *refusals
	// budgets bound the sends in flight of each host, address, project
	// and channel, and keep each host's circuit.
	budgets *budgets
	addrs   *addrs
}

// New returns a deliverer.
func New(cfg Config) *Deliverer {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if cfg.Limits == nil {
		cfg.Limits = DefaultLimits()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "klaxon"
	}
	if cfg.Queue == "" {
		cfg.Queue = wire.DeliveryQueue(cfg.Prefix)
	}
	if cfg.BulkQueue == "" {
		cfg.BulkQueue = wire.BulkQueue(cfg.Prefix)
	}
	if cfg.FailedQueue == "" {
		cfg.FailedQueue = wire.FailedQueue(cfg.Prefix)
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 12
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = 30 * time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 48 * time.Hour
	}
	if cfg.DigestMaxFirings <= 0 {
		cfg.DigestMaxFirings = DefaultDigestMaxFirings
	}
	if cfg.DigestMaxBytes <= 0 {
		cfg.DigestMaxBytes = DefaultDigestMaxBytes
	}
	cfg.MaxSends = cmp.Or(max(cfg.MaxSends, 0), DefaultMaxSends)
	cfg.MaxSendsPerHost = cmp.Or(max(cfg.MaxSendsPerHost, 0), DefaultMaxSendsPerHost)
	cfg.MaxSendsPerProject = cmp.Or(max(cfg.MaxSendsPerProject, 0), DefaultMaxSendsPerProject)
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	cfg.CircuitTimeouts = cmp.Or(max(cfg.CircuitTimeouts, 0), DefaultCircuitTimeouts)
	cfg.CircuitOpen = cmp.Or(max(cfg.CircuitOpen, 0), DefaultCircuitOpen)
	if cfg.WaitTimeout <= 0 {
		cfg.WaitTimeout = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	n, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return &Deliverer{
		cfg: cfg, channels: cfg.Channels, rdb: cfg.Redis, pub: cfg.Publisher, log: cfg.Logger, metrics: cfg.Metrics,
		limiter:  pacing.New(cfg.Redis, cfg.Prefix),
		scripts:  newScripts(),
		instance: strconv.FormatInt(n.Int64(), 36),
		refused:  newRefusals(),
		budgets: newBudgets(limits{host: cfg.MaxSendsPerHost, addr: 4 * cfg.MaxSendsPerHost,
			project: cfg.MaxSendsPerProject, channel: max(cfg.MaxSends/2, 1)},
			cfg.CircuitTimeouts, cfg.CircuitOpen, cfg.SendTimeout+sendGrace),
		addrs: newAddrs(cfg.Resolver, cfg.Now),
	}
}

// Queue is the name of the delivery queue.
func (d *Deliverer) Queue() string { return d.cfg.Queue }

// Queues are the names of the delivery queue and its bulk lane, the
// queues a deliverer consumes.
func (d *Deliverer) Queues() (main, bulk string) { return d.cfg.Queue, d.cfg.BulkQueue }

// Declare declares the delivery queues, and the failed and retry queues.
func (d *Deliverer) Declare(ctx context.Context, q Declarer) error {
	for _, name := range []string{d.cfg.Queue, d.cfg.BulkQueue} {
		if err := q.Declare(ctx, name, nil); err != nil {
			return fmt.Errorf("declare %s: %w", name, err)
		}
	}
	if err := q.Declare(ctx, d.cfg.FailedQueue, d.cfg.FailedBounds.Args()); err != nil {
		return fmt.Errorf("declare %s: %w", d.cfg.FailedQueue, err)
	}
	// What comes back from the retry queues (retries, turns at a
	// provider's pace, jobs put back by a full budget or an open circuit)
	// comes back in the bulk lane: the main lane carries only first tries
	// within their project's share. Retry queues made by an earlier
	// version, which lead to the main lane, are used as they are.
	for _, delay := range delays {
		if err := q.DeclareDelay(ctx, d.delayQueue(delay), d.cfg.BulkQueue, delay); err != nil {
			return fmt.Errorf("declare retry queue: %w", err)
		}
	}
	return nil
}

// Handle delivers a batch of jobs, one after the other; returning nil acks
// them. An error (Redis or the broker failing) holds the batch for another
// try: jobs already done are recognised then and not sent again. Jobs run
// concurrently as batches of their own: cmd/worker's consumer hands 64
// one-job batches at once, each acked as soon as it is done, so that a
// hung send holds no other job's ack.
func (d *Deliverer) Handle(ctx context.Context, b *queue.Batch) error {
	var errs []error
	for _, dl := range b.Deliveries {
		errs = append(errs, d.handle(ctx, dl))
	}
	return errors.Join(errs...)
}

func (d *Deliverer) handle(ctx context.Context, dl queue.Delivery) error {
	job, err := wire.DecodeJob(dl.Body)
	if err != nil {
		// Nothing to retry in a job that does not parse: keep it for a human.
		d.log.Error("unusable delivery job", "message_id", dl.MessageID, "error", err)
		m := dl.Message(d.cfg.FailedQueue)
		m.Headers[wire.ErrorHeader] = err.Error()
		return d.pub.Publish(ctx, m)
	}
	token := d.claimToken(dl.DeliveryTag)
	if d.now().Before(job.NotBefore) {
		// Back from the longest retry queue before the provider's
		// Retry-After or its turn: wait again, without a try.
		if job.Paced {
			d.metrics.Notifications.WithLabelValues(job.Channel, "throttled").Inc()
		}
		return d.schedule(ctx, &job, job.NotBefore.Sub(d.now()), true)
	}
	switch job.Kind {
	case wire.KindFlush:
		return d.deliverDigest(ctx, &job, token)
	case wire.KindSnooze:
		return d.deliverSummary(ctx, &job, token)
	case wire.KindQuiet:
		return d.deliverRecap(ctx, &job, token)
	}
	// wire.KindFirings, the kind left once decoded. A job parked past Keep
	// goes on, to fail for good.
	if why, wait := d.keptAway(ctx, &job); why != "" && (why != "circuit" || !d.jobTooOld(&job)) {
		return d.putBack(ctx, &job, why, wait)
	}
	return d.deliverFirings(ctx, &job, token)
}

// keptAway reports what would keep a firing job from being sent now, and
// for how long: its host's open circuit ("circuit") or a full budget (its
// name, budgets.go); "" when nothing would. A job that would only be
// turned away is put back before it costs a claim and a release in Redis.
func (d *Deliverer) keptAway(ctx context.Context, job *wire.Job) (string, time.Duration) {
	endpoint, err := d.cfg.Keys.Open(job.Endpoint, job.ProjectID, job.Channel)
	if err != nil {
		return "", 0 // send fails it, with the reason
	}
	t := d.target(ctx, job, endpoint)
	if wait := d.budgets.blocked(t.host, d.now()); wait > 0 {
		return "circuit", wait
	}
	return d.budgets.crowded(t, d.now())
}

// putBack puts back a job that keptAway kept away, spending no attempt.
func (d *Deliverer) putBack(ctx context.Context, job *wire.Job, why string, wait time.Duration) error {
	if why == "circuit" {
		return d.park(ctx, job, nil, wait)
	}
	return d.deferJob(ctx, job, why, wait)
}

// jobTooOld reports whether a firing job carries a firing older than Keep.
func (d *Deliverer) jobTooOld(job *wire.Job) bool {
	var ns []notify.Notification
	for _, f := range job.Firings {
		ns = append(ns, *f.Notification)
	}
	return d.tooOld(ns)
}

// deferJob puts back a job that was not tried, to come again after wait,
// once a send of its full budget may have ended. It spends no attempt.
func (d *Deliverer) deferJob(ctx context.Context, job *wire.Job, full string, wait time.Duration) error {
	d.metrics.Notifications.WithLabelValues(job.Channel, "deferred").Inc()
	d.log.Debug("notification deferred: a budget it sends within has every send it may have in flight",
		"channel", job.Channel, "project", job.ProjectID, "budget", full, "wait", wait.String())
	next := *job
	next.Paced = false // its turn passes meanwhile
	return d.schedule(ctx, &next, wait, true)
}

func (d *Deliverer) now() time.Time { return d.cfg.Now() }
