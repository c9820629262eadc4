package deliverer

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/wire"
)

//go:embed throttle.lua
var throttleLua string

//go:embed flush.lua
var flushLua string

//go:embed drop.lua
var dropLua string

// Publisher publishes messages and returns once the broker confirmed them.
type Publisher interface {
	Publish(ctx context.Context, msgs ...queue.Message) error
}

// Limiter paces messages to one destination under several sliding-window
// limits (counter.Limiter): Reserve gives each message its turn.
type Limiter interface {
	Reserve(ctx context.Context, key string, limits ...counter.Limit) (time.Duration, error)
}

// DefaultLimits are the providers' own rate limits per destination, so that
// a storm of firings is paced instead of refused: Telegram allows a chat
// about one message a second and a group twenty a minute; Slack an incoming
// webhook one a second, and Loop, Slack-compatible, is paced alike.
func DefaultLimits() map[string][]counter.Limit {
	return map[string][]counter.Limit{
		rules.Telegram: {counter.PerSecond(1), counter.PerMinute(20)},
		rules.Slack:    {counter.PerSecond(1)},
		rules.Loop:     {counter.PerSecond(1)},
	}
}

// Declarer declares the queues the deliverer needs.
type Declarer interface {
	Declare(ctx context.Context, name string, args amqp.Table) error
	DeclareDelay(ctx context.Context, name, target string, ttl time.Duration) error
}

// delays is the retry ladder (wire.RetryDelays).
var delays = wire.RetryDelays()

// Config configures a Deliverer. Zero values take the defaults shown.
type Config struct {
	Prefix string // namespace of Redis keys and queues [klaxon]
	// Queue is the delivery queue [<prefix>.deliveries].
	Queue string
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
	Limits map[string][]counter.Limit
	// DigestMaxFirings and DigestMaxBytes bound what one (rule, channel)
	// gathers during its minPeriod [500 firings, 1 MiB of jobs]: firings
	// past either are counted, and the digest says how many it left out.
	DigestMaxFirings int
	DigestMaxBytes   int
	// MaxSendsPerDestination and MaxSendsPerProject bound the sends one
	// destination (a channel and an endpoint), and one project, may have
	// in flight in this deliverer at once [8, 32]; a job over either waits
	// in the retry queues, so that a destination that hangs cannot take
	// the sends every project shares.
	MaxSendsPerDestination int
	MaxSendsPerProject     int
	// CircuitTimeouts consecutive timeouts of a destination open its
	// circuit [5]: its jobs then wait CircuitOpen [30 s] in the retry
	// queues, each wait counting as an attempt, until one send probes it.
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
	throttle *redis.Script
	flush    *redis.Script
	drop     *redis.Script
	// token tells this process' claims from others'.
	token string
	// unrecorded holds the outcomes this process could not record (Redis
	// failed right after a send), by claim key: when the job comes back,
	// the outcome is recorded and the message is not sent again.
	unrecorded sync.Map // string → unrecorded
	// refused is which rules' refused endpoints were logged lately.
	refused *refusals
	// dests bounds each destination's and project's sends in flight, and
	// keeps each destination's circuit.
	dests *destinations
}

type unrecorded struct {
	state string
	at    time.Time
}

// New returns a deliverer; channels are keyed by rules' channel names.
func New(cfg Config, channels map[string]notify.Channel, rdb redis.UniversalClient, pub Publisher, log *slog.Logger, m *metrics.Metrics) *Deliverer {
	if cfg.Limits == nil {
		cfg.Limits = DefaultLimits()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "klaxon"
	}
	if cfg.Queue == "" {
		cfg.Queue = wire.DeliveryQueue(cfg.Prefix)
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
	cfg.MaxSendsPerDestination = cmp.Or(max(cfg.MaxSendsPerDestination, 0), DefaultMaxSendsPerDestination)
	cfg.MaxSendsPerProject = cmp.Or(max(cfg.MaxSendsPerProject, 0), DefaultMaxSendsPerProject)
	cfg.CircuitTimeouts = cmp.Or(max(cfg.CircuitTimeouts, 0), DefaultCircuitTimeouts)
	cfg.CircuitOpen = cmp.Or(max(cfg.CircuitOpen, 0), DefaultCircuitOpen)
	if cfg.WaitTimeout <= 0 {
		cfg.WaitTimeout = time.Second
	}
	n, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return &Deliverer{
		cfg: cfg, channels: channels, rdb: rdb, pub: pub, log: log, metrics: m,
		limiter:  counter.NewLimiter(rdb, cfg.Prefix),
		throttle: redis.NewScript(throttleLua),
		flush:    redis.NewScript(flushLua),
		drop:     redis.NewScript(dropLua),
		token:    strconv.FormatInt(n.Int64(), 36),
		refused:  newRefusals(),
		dests: newDestinations(cfg.MaxSendsPerDestination, cfg.MaxSendsPerProject,
			cfg.CircuitTimeouts, cfg.CircuitOpen, cfg.SendTimeout+sendGrace),
	}
}

// Queue is the name of the delivery queue.
func (d *Deliverer) Queue() string { return d.cfg.Queue }

// Declare declares the delivery, failed and retry queues.
func (d *Deliverer) Declare(ctx context.Context, q Declarer) error {
	if err := q.Declare(ctx, d.cfg.Queue, nil); err != nil {
		return fmt.Errorf("declare %s: %w", d.cfg.Queue, err)
	}
	if err := q.Declare(ctx, d.cfg.FailedQueue, d.cfg.FailedBounds.Args()); err != nil {
		return fmt.Errorf("declare %s: %w", d.cfg.FailedQueue, err)
	}
	for _, delay := range delays {
		if err := q.DeclareDelay(ctx, d.delayQueue(delay), d.cfg.Queue, delay); err != nil {
			return fmt.Errorf("declare retry queue: %w", err)
		}
	}
	return nil
}

func (d *Deliverer) delayQueue(delay time.Duration) string {
	return wire.RetryQueue(d.cfg.Prefix, delay)
}

// Handle delivers a batch of jobs concurrently; returning nil acks them. An
// error (Redis or the broker failing) holds the batch for another try: jobs
// already done are recognised then and not sent again.
func (d *Deliverer) Handle(ctx context.Context, b *queue.Batch) error {
	errs := make([]error, len(b.Deliveries))
	var wg sync.WaitGroup
	for i, dl := range b.Deliveries {
		job, err := wire.DecodeJob(dl.Body)
		if err != nil {
			// Nothing to retry in a job that does not parse: keep it for a human.
			d.log.Error("unusable delivery job", "message_id", dl.MessageID, "error", err)
			m := dl.Message(d.cfg.FailedQueue)
			m.Headers[wire.ErrorHeader] = err.Error()
			errs[i] = d.pub.Publish(ctx, m)
			continue
		}
		claim := "c:" + d.token + ":" + strconv.FormatUint(dl.DeliveryTag, 10)
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch {
			case time.Now().Before(job.NotBefore):
				// Back from the longest retry queue before the provider's
				// Retry-After or its turn: wait again, without a try.
				if job.Paced {
					d.metrics.Notifications.WithLabelValues(job.Channel, "throttled").Inc()
				}
				errs[i] = d.schedule(ctx, &job, time.Until(job.NotBefore), true)
			case job.Snooze != nil:
				errs[i] = d.deliverSummary(ctx, &job, claim)
			case job.Notification == nil:
				errs[i] = d.deliverDigest(ctx, &job, claim)
			default:
				errs[i] = d.deliver(ctx, &job, claim)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Outcomes of a claim.
const (
	claimed = iota // ours to send
	done           // sent, digested or failed before
	busy           // another deliverer holds it
)

// claimKey is the Redis key recording a notification's delivery on a channel.
func (d *Deliverer) claimKey(id string) string { return d.cfg.Prefix + ":sent:" + id }

// claim marks a notification as being sent by us. A claim left by a crashed
// deliverer expires after twice the send timeout. The value found and its
// TTL are read in one transaction: read one after the other, the holder
// could record the notification as sent in between, and the record's TTL
// (Keep, 48 h) would be taken for the claim's, parking the job for the
// longest retry delay.
func (d *Deliverer) claim(ctx context.Context, key, token string) (int, time.Duration, error) {
	var set *redis.StatusCmd
	var ttl *redis.DurationCmd
	err := d.replicated(ctx, func(rdb redis.Cmdable) error {
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			set = p.SetArgs(ctx, key, token, redis.SetArgs{Mode: "NX", Get: true, TTL: 2 * d.cfg.SendTimeout})
			ttl = p.PTTL(ctx, key)
			return nil
		})
		if errors.Is(err, redis.Nil) {
			err = nil // no claim before ours: set says so below
		}
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("claim %s: %w", key, err)
	}
	old, err := set.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return claimed, 0, nil
	case err != nil:
		return 0, 0, fmt.Errorf("claim %s: %w", key, err)
	case old == token:
		return claimed, 0, nil // our own claim, from a failed try of this batch
	case len(old) > 2 && old[:2] == "c:":
		return busy, max(ttl.Val(), 0), nil
	}
	return done, 0, nil
}

func (d *Deliverer) record(ctx context.Context, key, state string) error {
	err := d.replicated(ctx, func(rdb redis.Cmdable) error { return rdb.Set(ctx, key, state, d.cfg.Keep).Err() })
	if err != nil {
		return fmt.Errorf("record %s as %s: %w", key, state, err)
	}
	return nil
}

// replicated runs write and, with Config.WaitReplicas, then waits until
// that many replicas hold it. WAIT counts what its own connection wrote,
// so both run on one connection taken from the pool.
func (d *Deliverer) replicated(ctx context.Context, write func(redis.Cmdable) error) error {
	client, single := d.rdb.(*redis.Client)
	if d.cfg.WaitReplicas <= 0 || !single {
		return write(d.rdb)
	}
	conn := client.Conn()
	defer conn.Close()
	if err := write(conn); err != nil {
		return err
	}
	n, err := conn.Do(ctx, "WAIT", d.cfg.WaitReplicas, d.cfg.WaitTimeout.Milliseconds()).Int64()
	if err == nil && n < int64(d.cfg.WaitReplicas) {
		err = fmt.Errorf("%d of %d replicas acknowledged the write within %s", n, d.cfg.WaitReplicas, d.cfg.WaitTimeout)
	}
	return err
}

// deliver sends one firing on one channel, once.
func (d *Deliverer) deliver(ctx context.Context, job *wire.Job, token string) error {
	n := job.Notification
	key := d.claimKey(job.Key())
	if ok, err := d.settled(ctx, key, nil); ok {
		return err
	}
	state, wait, err := d.claim(ctx, key, token)
	if err != nil {
		return err
	}
	switch state {
	case done:
		d.metrics.Notifications.WithLabelValues(job.Channel, "duplicate").Inc()
		return nil
	case busy:
		return d.schedule(ctx, job, wait, true)
	}
	if held, err := d.hold(ctx, job, key); held || err != nil {
		return err
	}

	if job.MinPeriod > 0 && !job.Throttled {
		gathered, omitted, err := d.gather(ctx, job)
		if err != nil {
			return err
		}
		if omitted {
			// Counted in the digest's "omitted", not listed: the digest
			// is full.
			d.metrics.Notifications.WithLabelValues(job.Channel, "omitted").Inc()
			return d.record(ctx, key, "omitted")
		}
		if gathered {
			d.metrics.Notifications.WithLabelValues(job.Channel, "digested").Inc()
			return d.record(ctx, key, "digested")
		}
		job.Throttled = true
	}

	msg := &notify.Message{ID: n.ID, ProjectID: job.ProjectID, RuleID: job.RuleID, Notifications: []notify.Notification{*n}}
	return d.send(ctx, job, key, msg, func(ctx context.Context) error { return d.rdb.Del(ctx, key).Err() }, nil)
}

// gather passes a job through its channel's minPeriod: gathered false
// means send it now, true that it waits for the digest, whose flush it
// scheduled if needed; omitted that the digest was full and only counts it.
func (d *Deliverer) gather(ctx context.Context, job *wire.Job) (gathered, omitted bool, err error) {
	body, err := json.Marshal(job)
	if err != nil {
		return false, false, fmt.Errorf("encode job: %w", err)
	}
	keys := d.digestKeys(job)
	r, err := d.throttle.Run(ctx, d.rdb, []string{keys[0], keys[1], keys[3]}, job.MinPeriod, job.Notification.ID, body,
		d.cfg.DigestMaxFirings, d.cfg.DigestMaxBytes).Int64Slice()
	if err == nil && !(len(r) == 1 && r[0] == 0 || len(r) == 3 && (r[0] == 1 || r[0] == 2)) {
		err = fmt.Errorf("unexpected reply %v", r)
	}
	if err != nil {
		return false, false, fmt.Errorf("minPeriod of rule %s on %s: %w", job.RuleID, job.Channel, err)
	}
	if r[0] == 0 {
		return false, false, nil
	}
	if r[0] == 2 {
		if err := d.schedule(ctx, flushJob(job), time.Duration(r[1])*time.Millisecond, false); err != nil {
			return false, false, err
		}
	}
	return true, r[2] == 1, nil
}

// flushJob is the job flushing the digest of job's rule and channel.
func flushJob(job *wire.Job) *wire.Job {
	return &wire.Job{Channel: job.Channel, Endpoint: job.Endpoint, MinPeriod: job.MinPeriod, ProjectID: job.ProjectID, RuleID: job.RuleID}
}

// digestKeys are the keys of a (rule, channel)'s minPeriod: its state, the
// notifications pending, the digest being sent, and the ids gathered. They
// share a hash tag.
func (d *Deliverer) digestKeys(job *wire.Job) []string {
	base := d.cfg.Prefix + ":{mp:" + job.ProjectID + ":" + job.RuleID + ":" + job.Channel + "}"
	return []string{base, base + ":pending", base + ":inflight", base + ":gathered"}
}

// deliverDigest sends what a (rule, channel) gathered during its minPeriod.
func (d *Deliverer) deliverDigest(ctx context.Context, job *wire.Job, token string) error {
	for {
		again, err := d.deliverDigestOnce(ctx, job, token)
		if err != nil || !again {
			return err
		}
		// This job settled a digest that was in flight before it came, and
		// may be the flush that what was gathered since counts on (its
		// sender, finding it gone, has nothing left to do): flush again.
		job = flushJob(job)
	}
}

// deliverDigestOnce sends the digest in flight, or takes what is pending as
// one. again reports that it settled a digest it did not take itself.
func (d *Deliverer) deliverDigestOnce(ctx context.Context, job *wire.Job, token string) (again bool, err error) {
	keys := d.digestKeys(job)
	r, err := d.flush.Run(ctx, d.rdb, keys[:3], job.MinPeriod).Slice()
	if err != nil {
		return false, fmt.Errorf("flush digest of rule %s on %s: %w", job.RuleID, job.Channel, err)
	}
	reply := r[0].(int64)
	generation := ""
	var omitted int64
	for i := 2; (reply == 0 || reply == 3) && i < len(r); i += 2 {
		switch r[i-1] {
		case "#":
			generation = fmt.Sprint(r[i])
		case "#omitted":
			omitted, _ = strconv.ParseInt(fmt.Sprint(r[i]), 10, 64)
		}
	}
	if job.Generation != generation {
		// The digest this job retried was settled by another flush job.
		job = flushJob(job)
	}
	switch reply {
	case 1:
		return false, d.schedule(ctx, job, time.Duration(r[1].(int64))*time.Millisecond, false)
	case 2:
		return false, nil
	}
	job.Generation = generation // for its retries
	taken := reply == 0
	var ns []notify.Notification
	for i := 2; i < len(r); i += 2 {
		if f, _ := r[i-1].(string); strings.HasPrefix(f, "#") {
			continue // the digest's own fields, not a firing
		}
		var pending wire.Job
		if err := json.Unmarshal([]byte(r[i].(string)), &pending); err != nil || pending.Notification == nil {
			d.log.Error("unusable job in a digest: dropped from it", "rule", job.RuleID, "channel", job.Channel, "error", err)
			continue
		}
		ns = append(ns, *pending.Notification)
	}
	slices.SortFunc(ns, func(a, b notify.Notification) int {
		return cmpTimeThenID(a, b)
	})
	msg := digestMessage(job, ns, omitted)
	key := d.digestKey(msg, job.Channel)
	dropped := false
	drop := func(ctx context.Context) error {
		if err := d.drop.Run(ctx, d.rdb, keys[2:3], generation).Err(); err != nil {
			return fmt.Errorf("drop digest %s in flight: %w", msg.ID, err)
		}
		dropped = true
		return nil
	}
	if ok, err := d.settled(ctx, key, drop); ok {
		return dropped && !taken, err
	}
	state, wait, err := d.claim(ctx, key, token)
	if err != nil {
		return false, err
	}
	switch state {
	case done:
		err := drop(ctx)
		return dropped && !taken, err
	case busy:
		return false, d.schedule(ctx, job, wait, true)
	}
	err = d.send(ctx, job, key, msg, func(ctx context.Context) error {
		return d.rdb.Del(ctx, key).Err() // keep the digest in flight for the retry
	}, drop)
	return dropped && !taken, err
}

// digestKey is the Redis key recording a digest's delivery on a channel. A
// digest of one carries its firing's id, whose own key already says
// "digested": its send is recorded apart.
func (d *Deliverer) digestKey(m *notify.Message, channel string) string {
	if !m.Digest {
		return d.claimKey(m.ID + ":" + channel + ":digest")
	}
	return d.claimKey(m.ID + ":" + channel)
}

func cmpTimeThenID(a, b notify.Notification) int {
	return cmp.Or(a.FiredAt.Compare(b.FiredAt), strings.Compare(a.ID, b.ID))
}

// digestMessage is one message for the notifications of a digest and the
// count of those it left out: the notification itself when there is one
// alone, else a digest with an id derived from its contents, so a resend
// carries the same id.
func digestMessage(job *wire.Job, ns []notify.Notification, omitted int64) *notify.Message {
	m := &notify.Message{ProjectID: job.ProjectID, RuleID: job.RuleID, Notifications: ns, Omitted: omitted}
	if len(ns) == 1 && omitted == 0 {
		m.ID = ns[0].ID
		return m
	}
	h := sha256.New()
	for _, n := range ns {
		h.Write([]byte(n.ID))
	}
	if omitted > 0 {
		fmt.Fprintf(h, "+%d", omitted)
	}
	m.ID, m.Digest = "digest-"+hex.EncodeToString(h.Sum(nil)[:16]), true
	return m
}

// send tries the channel once and settles the job: recorded as sent,
// scheduled for a retry (after release drops the claim), or recorded as
// failed. cleanup, if any, runs once the message is settled.
func (d *Deliverer) send(ctx context.Context, job *wire.Job, key string, msg *notify.Message, release, cleanup func(context.Context) error) error {
	// ctx ends when the broker channel that delivered the job dies, not
	// only when the worker stops. A send the provider may already have
	// taken must not be cut off then, nor its outcome go unrecorded: the
	// job comes again, and would be sent again. So the send and what
	// follows it get sendGrace after ctx ends.
	ctx, cancel := withGrace(ctx, sendGrace)
	defer cancel()
	start := time.Now()
	retry, scheduled, err := d.try(ctx, job, key, msg, release)
	if scheduled {
		return err
	}
	log := d.log.With("channel", job.Channel, "project", job.ProjectID, "rule", job.RuleID,
		"notification_id", msg.ID, "firings", len(msg.Notifications), "attempt", job.Attempt+1)
	if err == nil {
		d.metrics.Notifications.WithLabelValues(job.Channel, "sent").Inc()
		for _, n := range msg.Notifications {
			d.metrics.DeliveryLatency.WithLabelValues(job.Channel).Observe(time.Since(n.FiredAt).Seconds())
		}
		log.Info("notification sent", "took_ms", time.Since(start).Milliseconds())
		if err := d.record(ctx, key, "sent"); err != nil {
			d.remember(key, "sent")
			return err
		}
		return runCleanup(ctx, cleanup)
	}
	if ctx.Err() != nil {
		// Cut short: the provider may or may not have the message. The
		// claim stays until it expires, then the job, which was not acked
		// and comes again, is sent again.
		return ctx.Err()
	}
	if retry && job.Attempt+1 < d.cfg.MaxAttempts {
		if err := release(ctx); err != nil {
			return fmt.Errorf("release claim %s: %w", key, err)
		}
		next := *job
		next.Attempt++
		next.Paced = false // a retry takes a turn of its own
		// A Retry-After sets the earliest retry, not the pace: taken
		// instead of the backoff, a short one answered again and again
		// would spend every attempt within seconds and lose the message.
		var after notify.RetryAfter
		delay := backoff(next.Attempt)
		if errors.As(err, &after) {
			delay = max(after.RetryAfter(), delay)
		}
		next.NotBefore = time.Time{}
		if longest := delays[len(delays)-1]; delay > longest {
			next.NotBefore = time.Now().Add(delay)
		}
		if _, parked := errors.AsType[*errCircuitOpen](err); parked {
			// Logged once, when the circuit opened, not once a job.
			log.Debug("notification parked, will retry", "error", err, "retry_in", delay.String())
			d.metrics.Notifications.WithLabelValues(job.Channel, "parked").Inc()
		} else {
			log.Warn("notification failed, will retry", "error", err, "retry_in", delay.String())
			d.metrics.Notifications.WithLabelValues(job.Channel, "retried").Inc()
		}
		return d.schedule(ctx, &next, delay, true)
	}
	switch {
	case !netguard.IsRefused(err):
		log.Error("notification failed for good", "error", err, "retryable", retry)
	case d.refused.first(job.ProjectID+"\x00"+job.RuleID+"\x00"+job.Channel, time.Now()):
		// The reason names an address or host, never the endpoint URL.
		log.Error("endpoint refused",
			"error", err)
	default:
		log.Debug("notification failed for good", "error", err)
	}
	d.metrics.Notifications.WithLabelValues(job.Channel, "failed").Inc()
	failed := *job
	if msg.Digest {
		failed.Notification = nil
	}
	body, jerr := json.Marshal(struct {
		wire.Job
		Notifications []notify.Notification `json:"notifications,omitempty"`
	}{failed, msg.Notifications})
	if jerr != nil {
		return fmt.Errorf("encode failed job: %w", jerr)
	}
	if err := d.pub.Publish(ctx, queue.Message{
		RoutingKey: d.cfg.FailedQueue, Body: body, MessageID: msg.ID + ":" + job.Channel,
		ContentType: "application/json", Headers: amqp.Table{wire.ErrorHeader: err.Error()},
	}); err != nil {
		return fmt.Errorf("record failed notification: %w", err)
	}
	if err := d.record(ctx, key, "failed"); err != nil {
		d.remember(key, "failed")
		return err
	}
	return runCleanup(ctx, cleanup)
}

// remember keeps an outcome that could not be recorded, for settled.
// Outcomes older than Keep are forgotten: their job went elsewhere.
func (d *Deliverer) remember(key, state string) {
	now := time.Now()
	d.unrecorded.Range(func(k, v any) bool {
		if now.Sub(v.(unrecorded).at) > d.cfg.Keep {
			d.unrecorded.Delete(k)
		}
		return true
	})
	d.unrecorded.Store(key, unrecorded{state: state, at: now})
}

// settled records the outcome of an earlier try of this job that could not
// be recorded then, and runs cleanup. ok reports whether
// there was one: then the job is done once err is nil.
func (d *Deliverer) settled(ctx context.Context, key string, cleanup func(context.Context) error) (ok bool, err error) {
	v, ok := d.unrecorded.Load(key)
	if !ok {
		return false, nil
	}
	if err := d.record(ctx, key, v.(unrecorded).state); err != nil {
		return true, err
	}
	d.unrecorded.Delete(key)
	d.log.Info("recorded a notification's outcome after Redis failed", "outcome", v.(unrecorded).state)
	return true, runCleanup(ctx, cleanup)
}

// sendGrace is how long a send under way, and the record of its outcome,
// may go on once the job's context has ended. With the consumer's stop
// grace (5 s), a stopping worker still exits within 10 s.
const sendGrace = 3 * time.Second

// withGrace returns a context that ends grace after ctx does (or when
// cancel is called), with ctx's values.
func withGrace(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-gctx.Done():
		}
	})
	return gctx, func() { stop(); cancel() }
}

// runCleanup runs a settled message's cleanup, if it has one.
func runCleanup(ctx context.Context, f func(context.Context) error) error {
	if f == nil {
		return nil
	}
	return f(ctx)
}

// schedule publishes job to come back on the delivery queue after delay:
// through the longest retry queue not over it when atLeast is false (a
// flush that must not come early, and is re-checked on arrival), or the
// shortest at or over it, expiring at delay, when atLeast is true (a retry
// that must not come too soon, a turn reserved at the provider's pace).
func (d *Deliverer) schedule(ctx context.Context, job *wire.Job, delay time.Duration, atLeast bool) error {
	body, err := json.Marshal(job)
	if err != nil {
		return fmt.Errorf("encode job: %w", err)
	}
	rung := pickDelay(delay, atLeast)
	q := d.delayQueue(rung)
	id := "flush"
	if job.Notification != nil {
		id = job.Key()
	}
	m := queue.Message{RoutingKey: q, Body: body, MessageID: id, ContentType: "application/json"}
	if atLeast && delay < rung {
		// Out at delay rather than the rung's TTL, unless a message ahead
		// in the queue holds it (a queue lets messages out in order).
		m.Expiration = delay
	}
	if err := d.pub.Publish(ctx, m); err != nil {
		return fmt.Errorf("schedule %s on %s: %w", id, q, err)
	}
	return nil
}

// pickDelay picks a rung of the retry ladder for delay: the shortest at or
// over it when atLeast, else the longest at or under it (the shortest if
// none is).
func pickDelay(delay time.Duration, atLeast bool) time.Duration {
	if atLeast {
		for _, l := range delays {
			if l >= delay {
				return l
			}
		}
		return delays[len(delays)-1]
	}
	pick := delays[0]
	for _, l := range delays {
		if l <= delay {
			pick = l
		}
	}
	return pick
}

// backoff is the wait before attempt n (1 = the first retry): 1 s doubling
// up to 512 s, and at random half of that, so that deliverers retrying
// together spread out.
func backoff(n int) time.Duration {
	i := min(3+n-1, len(delays)-1) // delays[3] is 1 s
	return delays[i-mrand.IntN(2)]
}
