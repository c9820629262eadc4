package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/channels"
	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/deliverer"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/hawkdb"
	"github.com/klaxonhq/klaxon/internal/livegroups"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/email"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/starved"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/storm"
	"github.com/klaxonhq/klaxon/internal/version"
	"github.com/klaxonhq/klaxon/internal/watchdog"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// stopDeadline is how long main lets run stop after a signal before exiting
// anyway; docs/contract.md §7 promises an exit within 10 s.
const stopDeadline = 9500 * time.Millisecond

// run wires the worker from cfg and runs it until ctx is cancelled.
func run(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	log.Info("klaxon starting", "version", version.Read().String(), "config", cfg)
	if cfg.EndpointKey == "" {
		// Said once, at start: an operator who never read the setting's
		// documentation learns that the queues and Redis hold secrets.
		log.Warn("endpoints are kept in clear: "+config.EnvEndpointKey+" is unset",
			"setting", config.EnvEndpointKey,
			"holds", "the endpoints of rules: webhook, Slack and Loop URLs with their tokens, Telegram chat ids, email addresses",
			"where", "delivery jobs, retry and failed queues in RabbitMQ; pending digests and storms in Redis",
			"fix", "set "+config.EnvEndpointKey+" to a base64 key of 32 bytes to seal them")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	redisOpts, err := cfg.RedisOptions()
	if err != nil {
		return err
	}
	redisOpts.DefaultPoolSize(redisPoolSize(len(cfg.IncomingQueues()), cfg.BatchesInFlight))
	rdb := redisOpts.NewClient()
	defer rdb.Close()

	pub, err := queue.NewPublisher(queue.PublisherConfig{URL: cfg.AMQPURL, ConnectionName: "klaxon-publisher",
		QueueType: queue.Type(cfg.QueueType), Logger: log})
	if err != nil {
		return err
	}
	defer pub.Close()
	// The deliverer publishes on a connection of its own: a storm of jobs
	// put back for their turn (hundreds at once, each a publish) must not
	// make the evaluator's publishes wait behind them, nor the other way.
	dpub, err := queue.NewPublisher(queue.PublisherConfig{URL: cfg.AMQPURL, ConnectionName: "klaxon-deliverer-publisher",
		QueueType: queue.Type(cfg.QueueType), Logger: log})
	if err != nil {
		return err
	}
	defer dpub.Close()

	var lastLoad atomic.Pointer[error] // of the last failed load, for /readyz
	cache, closeRules, err := ruleCache(cfg, log, m, &lastLoad)
	if err != nil {
		return err
	}
	defer closeRules()

	// Build every component first: none of this waits for a dependency.
	var consumers []consumer
	var work []func(context.Context) error // started once the queues are declared
	work = append(work, cache.Run)

	if cfg.Role.Evaluates() {
		engine := counter.New(rdb, counter.Options{Prefix: cfg.Prefix, DedupTTL: cfg.DedupTTL,
			GroupsPerCall: cfg.GroupsPerCall, WaitReplicas: cfg.WaitReplicas, WaitTimeout: cfg.WaitTimeout,
			StateCacheBytes: cfg.StateCache})
		storms := storm.New(storm.Config{Redis: rdb, Prefix: cfg.Prefix, Rings: engine, Rules: cache, Publisher: pub,
			DeliveryQueue: wire.DeliveryQueue(cfg.Prefix), Keys: cfg.EndpointKeys(), All: cfg.StormOver, Log: log.With("stage", "storms"), Metrics: m})
		work = append(work, storms.Run)
		var (
			groups      evaluator.Groups
			repetitions evaluator.Repetitions
		)
		if cfg.EventsMongoURL != "" {
			// Optional: the driver connects lazily, and every read is
			// bounded and cached, so an events database that is down at
			// start or later costs messages their history, nothing more.
			reader, err := hawkdb.NewReader(cfg.EventsMongoURL, cfg.EventsDatabase, hawkdb.Options{})
			if err != nil {
				return fmt.Errorf("%s: %w", config.EnvEventsMongoURL, err)
			}
			defer reader.Close(context.Background())
			groups, repetitions = reader, reader
		} else if strings.Contains(cfg.EventURL, "{eventId}") {
			log.Info(eventIDUnknown, "fallback", cfg.EventURLFallback)
		}
		// One per worker, shared by its evaluators: a project's share of
		// the delivery queue is the worker's to count.
		lanes := &evaluator.Lanes{Bulk: wire.BulkQueue(cfg.Prefix)}
		// One per worker: it warns of a starved rule once an hour,
		// whichever queue brought the events.
		starving := starved.New(starved.Config{Redis: rdb, Prefix: cfg.Prefix, Log: log.With("stage", "evaluator"), Metrics: m})
		// One per worker: it reads each busy project's live groups back
		// from Redis every couple of seconds, whichever queue counted them.
		live := livegroups.New(livegroups.Config{Redis: rdb, States: engine, Prefix: cfg.Prefix, Max: int64(cfg.MaxGroups),
			Log: log.With("stage", "evaluator"), Metrics: m})
		work = append(work, live.Run)
		// One consumer per incoming queue, each on its own connection: a
		// queue deleted or refused holds up its own consumer only. And one
		// evaluator per queue, sharing everything but the lock that lets
		// one batch at a time count: the hashed queues hold disjoint
		// groups, so their batches count side by side without losing
		// compare-and-sets to each other.
		for _, in := range cfg.IncomingQueues() {
			eval := &evaluator.Evaluator{
				Rules:         cache,
				Counter:       engine,
				Storms:        storms,
				Starved:       starving,
				Live:          live,
				Publisher:     pub,
				Groups:        groups,
				Repetitions:   repetitions,
				DeadQueue:     wire.DeadQueue(cfg.Queue),
				DeliveryQueue: wire.DeliveryQueue(cfg.Prefix),
				FailedQueue:   wire.FailedQueue(cfg.Prefix),
				Lanes:         lanes,
				EventURL:      evaluator.Link{Template: cfg.EventURL, Fallback: cfg.EventURLFallback},
				Keys:          cfg.EndpointKeys(),
				Log:           log.With("stage", "evaluator"),
				Metrics:       m,
			}
			name := "klaxon-evaluator"
			if in.Name != cfg.Queue {
				name += " " + in.Name
			}
			c, err := queue.NewConsumer(queue.ConsumerConfig{
				URL: cfg.AMQPURL, Queue: in.Name, Exchange: in.Exchange, QueueType: queue.Type(cfg.QueueType), ConnectionName: name,
				Prefetch: cfg.Prefetch, MaxBatch: cfg.BatchSize, Linger: linger(cfg.BatchLinger),
				Concurrency: cfg.BatchesInFlight, InOrder: true, Pipelined: true,
				MaxHeldBytes: cfg.MaxHeldBytes, Logger: log.With("stage", "evaluator"),
				Hooks: batchHooks(m, "evaluator", in.Name),
			})
			if err != nil {
				return err
			}
			consumers = append(consumers, consumer{"evaluator", in.Name, c})
			work = append(work, func(ctx context.Context) error { return c.Consume(ctx, eval.Handle) })
		}
	}

	// The delivery queues exist whatever the role: evaluators publish to them.
	var chans map[string]notify.Channel
	var hpub *queue.Publisher // KLAXON_OUTPUT=hawk-senders: tasks for Hawk's senders
	var hawkQueues []string
	if cfg.Output == config.OutputHawkSenders {
		hawkSendersNotice(cfg, log)
		// A connection of its own, and classic queues whatever
		// KLAXON_QUEUE_TYPE: Hawk's sender workers declare their queues
		// durable and classic, without arguments, and so does this.
		hpub, err = queue.NewPublisher(queue.PublisherConfig{URL: cfg.AMQPURL, ConnectionName: "klaxon-hawk-senders", Logger: log})
		if err != nil {
			return err
		}
		defer hpub.Close()
		chans = channels.HawkSenders(cfg, hpub, hawkCounter{m.HawkTasks}, log.With("stage", "deliverer"))
		hawkQueues = channels.HawkSenderQueues(cfg)
	} else if chans, err = channels.Build(cfg, cfg.MaxSendsPerHost); err != nil {
		return err
	}
	deadBounds := queue.Bounds{MaxMessages: cfg.DeadMaxMessages, MaxBytes: cfg.DeadMaxBytes}
	dlv := deliverer.New(deliverer.Config{Prefix: cfg.Prefix, Queue: wire.DeliveryQueue(cfg.Prefix), SendTimeout: cfg.SendTimeout,
		FailedBounds: deadBounds, DigestMaxFirings: cfg.DigestMaxFirings, DigestMaxBytes: cfg.DigestMaxBytes,
		MaxSends: cfg.MaxSends, MaxSendsPerHost: cfg.MaxSendsPerHost, MaxSendsPerProject: cfg.MaxSendsPerProject,
		CircuitTimeouts: cfg.CircuitTimeouts, CircuitOpen: cfg.CircuitOpen,
		WaitReplicas: cfg.WaitReplicas, WaitTimeout: cfg.WaitTimeout, Keys: cfg.EndpointKeys(),
		Levels: levels{rules: cache, rings: counter.New(rdb, counter.Options{Prefix: cfg.Prefix, DedupTTL: cfg.DedupTTL})},
		Redis:  rdb, Publisher: dpub, Channels: chans, Logger: log.With("stage", "deliverer"), Metrics: m})
	if cfg.Role.Delivers() {
		// The main lane and the bulk lane (evaluator.Lanes) each have half
		// of the jobs a worker works on: a flood in the bulk lane never
		// holds the main lane's jobs back.
		main, bulk := dlv.Queues()
		var lanes []*queue.Consumer
		for _, q := range []string{main, bulk} {
			c, err := queue.NewConsumer(queue.ConsumerConfig{
				URL: cfg.AMQPURL, Queue: q, QueueType: queue.Type(cfg.QueueType), ConnectionName: "klaxon-deliverer " + q,
				Prefetch: cfg.MaxSends / 2, MaxBatch: 1, Concurrency: cfg.MaxSends / 2, MaxHeldBytes: cfg.MaxHeldBytes / 2,
				Logger: log.With("stage", "deliverer"), Hooks: batchHooks(m, "deliverer", q),
			})
			if err != nil {
				return err
			}
			consumers = append(consumers, consumer{"deliverer", q, c})
			lanes = append(lanes, c)
		}
		work = append(work, func(ctx context.Context) error {
			var tasks []func(context.Context) error
			for _, c := range lanes {
				tasks = append(tasks, func(ctx context.Context) error { return c.Consume(ctx, dlv.Handle) })
			}
			err := runAll(ctx, tasks)
			// Sends whose outcome Redis refused are known only to this
			// process: record them before it goes.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
			defer cancel()
			if ferr := dlv.Flush(fctx); ferr != nil {
				log.Warn("stopping with notification outcomes unrecorded", "stage", "deliverer", "error", ferr)
			}
			return err
		})
	}

	checks := map[string]func(context.Context) error{
		"redis": func(ctx context.Context) error { return redisReady(ctx, rdb, cfg.WaitReplicas) },
		"rules": func(context.Context) error {
			if !cache.Ready() {
				if err := lastLoad.Load(); err != nil {
					return fmt.Errorf("no rules loaded yet: %v; %s", *err, cfg.RulesStoreHint())
				}
				return errors.New("no rules loaded yet")
			}
			return nil
		},
		"amqp": func(context.Context) error {
			var down []string
			for _, c := range consumers {
				if !c.Connected() {
					down = append(down, c.queue)
				}
			}
			if len(down) > 0 {
				return fmt.Errorf("not consuming %s", strings.Join(down, ", "))
			}
			return nil
		},
		"batches": func(context.Context) error { return heldBatches(consumers, cfg.MaxBatchHold, m) },
	}
	handler := mux(reg, checks, m)
	if cfg.Pprof {
		servePprof(handler)
		log.Warn("profiler on: /debug/pprof/ is served", "http", cfg.HTTPAddr)
	}
	// Listen before anything waits for the broker or the rules store: while
	// they are unreachable, /healthz must answer (or a liveness probe
	// restarts a worker that is only waiting, over and over) and /metrics
	// must show klaxon_dependency_up. A port already taken fails here, at once.
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http on %s: %w", cfg.HTTPAddr, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}

	// start waits for the dependencies the queues need, retrying (the
	// publisher logs "rabbitmq unavailable" and backs off), then consumes.
	start := func(ctx context.Context) error {
		if err := cache.Refresh(ctx); err != nil {
			// Not fatal: the store may come up later; until then /readyz says no.
			log.Warn("rules not loaded yet", "error", err, "hint", cfg.RulesStoreHint())
		}
		if cfg.Role.Evaluates() {
			if err := pub.Declare(ctx, wire.DeadQueue(cfg.Queue), deadBounds.Args()); err != nil {
				return fmt.Errorf("declare %s: %w", wire.DeadQueue(cfg.Queue), err)
			}
			if cfg.QueueShards > 0 {
				// Here rather than in each consumer's retries: a broker
				// without the plugin stops the worker with what to enable.
				if err := pub.DeclareHashExchange(ctx, wire.HashExchange(cfg.Queue)); err != nil {
					return fmt.Errorf("%s=%d: %w", config.EnvQueueShards, cfg.QueueShards, err)
				}
			}
		}
		if err := dlv.Declare(ctx, dpub); err != nil {
			return err
		}
		if cfg.Role.Delivers() {
			// Declared here too, so that tasks published before Hawk's
			// senders first start wait for them in their queues.
			for _, q := range hawkQueues {
				if err := hpub.Declare(ctx, q, nil); err != nil {
					return fmt.Errorf("declare Hawk's sender queue %s: %w", q, err)
				}
			}
		}
		log.Info("klaxon running", "role", cfg.Role, "queues", consumedQueues(cfg), "http", ln.Addr().String(), "channels", channelNames(chans))
		return runAll(ctx, work)
	}
	watched := append(consumedQueues(cfg), wire.DeliveryQueue(cfg.Prefix), wire.BulkQueue(cfg.Prefix))
	tasks := []func(context.Context) error{
		func(ctx context.Context) error { return serve(ctx, srv, ln, log) },
		func(ctx context.Context) error { return watch(ctx, checks, m, log) },
		func(ctx context.Context) error { return depths(ctx, pub, watched, m) },
		start,
	}
	if cfg.OperatorAlerts() {
		// Beside start, not in it: the watchdog must look while the
		// worker waits for a dependency, and send on a path of its own.
		dog, err := operatorWatchdog(cfg, pub, rdb, watched, m, log)
		if err != nil {
			return err
		}
		tasks = append(tasks, dog.Run)
	}
	return runAll(ctx, tasks)
}

// operatorWatchdog alerts KLAXON_OPERATOR_WEBHOOK when the queues stall,
// events are counted late or a channel keeps failing (internal/watchdog).
// The email goes through a mailer of its own, outside the email channel's
// budgets and circuit, which may be what is failing.
func operatorWatchdog(cfg config.Config, pub *queue.Publisher, rdb redis.UniversalClient, queues []string, m *metrics.Metrics, log *slog.Logger) (*watchdog.Watchdog, error) {
	var to watchdog.Each
	if cfg.OperatorWebhook != "" {
		to = append(to, &watchdog.Webhook{URL: cfg.OperatorWebhook, Client: &http.Client{Timeout: cfg.SendTimeout}})
	}
	if cfg.OperatorEmail != "" {
		mailer, err := email.New(email.Config{Addr: cfg.SMTPAddr, Username: cfg.SMTPUsername, Password: cfg.SMTPPassword,
			From: cfg.SMTPFrom, TLS: cfg.SMTPTLS, Timeout: cfg.SendTimeout})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvOperatorEmail, err)
		}
		to = append(to, &watchdog.Email{To: cfg.OperatorEmail, Mailer: mailer})
	}
	host, _ := os.Hostname()
	return watchdog.New(watchdog.Config{
		Limit: cfg.OperatorDelay, Queues: queues, Depth: pub.Depth, Metrics: m,
		Redis: rdb, Prefix: cfg.Prefix, Worker: host, Notifier: to,
		Log: log.With("stage", "watchdog"),
	}), nil
}

// hawkSendersNotice says once, at start, where firings go with
// KLAXON_OUTPUT=hawk-senders, and warns of rules Hawk cannot look up.
func hawkSendersNotice(cfg config.Config, log *slog.Logger) {
	log.Info("firings go to Hawk's sender workers, which render and send them",
		"setting", config.EnvOutput, "queues", strings.Join(channels.HawkSenderQueues(cfg), ","))
	if cfg.RulesFile != "" {
		log.Warn("Hawk's senders look rules up in Hawk's database, not in "+config.EnvRulesFile,
			"setting", config.EnvOutput, "rules_file", cfg.RulesFile,
			"fix", "Hawk's sender drops a task whose project or rule Hawk does not have; use the MongoDB rules store")
	}
}

// hawkCounter counts on klaxon_hawk_tasks_total.
type hawkCounter struct{ vec *prometheus.CounterVec }

func (c hawkCounter) Add(channel, outcome string, n float64) {
	c.vec.WithLabelValues(channel, outcome).Add(n)
}

// redisLogger passes go-redis' log lines to slog.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client", "detail", fmt.Sprintf(format, v...))
}

// flushTimeout bounds how long a stopping worker tries to record the
// outcomes of sends Redis refused to record (a failover under way): well
// inside the 10 s a stop may take.
const flushTimeout = 5 * time.Second

// How the deliverer consumes its queue: every job is a batch of its own,
// handled and acked on its own, up to KLAXON_MAX_SENDS of them at once,
// each on its own goroutine. A hung send then pins its own job and
// nothing else: what bounds the jobs one host, project or channel may hold
// is the deliverer's budgets, shares of that total, not the prefetch. Jobs
// gain nothing from sharing a batch (each has its own claim, send and
// record in Redis); the cost, an ack frame and a handler call per job, is
// nothing next to a send.

// redisPoolSize is how many Redis connections a worker may need at once
// (each a cluster node's, on a cluster): one for each batch of each
// incoming queue, deliveryConns for the delivery jobs, which hold one only
// while they claim or record (a hung send holds none), and ten for the
// rest (storms, the limiter, readiness probes). go-redis' own default, ten
// per Go processor, gave a worker on one processor ten for its delivery
// jobs: a burst of sends queued for connections before recording, and a
// kill then repeated more of them. Connections are opened only when needed.
func redisPoolSize(queues, batchesInFlight int) int {
	return deliveryConns + queues*max(batchesInFlight, 1) + 10
}

// deliveryConns is the Redis connections the delivery jobs share.
const deliveryConns = 128

// ruleCache builds the rule source of cfg and a cache in front of it.
// A failed load is kept in lastLoad.
func ruleCache(cfg config.Config, log *slog.Logger, m *metrics.Metrics, lastLoad *atomic.Pointer[error]) (*store.Cache, func(), error) {
	var src store.Source
	closeSrc := func() {}
	if cfg.RulesFile != "" {
		src = rulesFile{store.NewFileSource(cfg.RulesFile)}
	} else {
		mongo, err := newMongoSource(cfg.MongoURL, cfg.MongoDatabase, log.With("stage", "rules"))
		if err != nil {
			return nil, nil, err
		}
		src = mongo
		closeSrc = func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			mongo.Close(ctx)
		}
	}
	warned := 0
	cache := store.NewCache(src, store.CacheOptions{
		Interval: cfg.RulesRefresh,
		Limits:   cfg.Limits,
		Logger:   log.With("stage", "rules"),
		OnLoad: func(r store.LoadResult) {
			if r.Err != nil {
				lastLoad.Store(&r.Err)
				m.RuleLoads.WithLabelValues("error").Inc()
				m.Up.WithLabelValues("rules").Set(0)
				return
			}
			m.RuleLoads.WithLabelValues("ok").Inc()
			m.Up.WithLabelValues("rules").Set(1)
			if n := len(r.Served.Problems()); n != warned {
				m.RuleWarnings.Add(float64(max(n-warned, 0)))
				warned = n
			}
		},
	})
	return cache, closeSrc, nil
}

func channelNames(channels map[string]notify.Channel) []string {
	var names []string
	for _, n := range rules.ChannelNames {
		if channels[n] != nil {
			names = append(names, n)
		}
	}
	return names
}

// consumer is a queue consumer and the queue it reads.
type consumer struct {
	stage, queue string
	*queue.Consumer
}

// processors is how many of Go's processors a worker reading queues
// incoming queues runs on when GOMAXPROCS is not set: one per queue, at
// most the available ones Go would use (the host's or its container's).
func processors(queues, available int) int {
	return max(1, min(queues, available))
}

// consumedQueues names the incoming queues this worker reads.
func consumedQueues(cfg config.Config) []string {
	var names []string
	for _, in := range cfg.IncomingQueues() {
		names = append(names, in.Name)
	}
	return names
}

// batchHooks count the batches of a stage, say whether the queue name is
// consumed (klaxon_queue_consuming), 0 until it is, and the bytes its
// consumer holds.
func batchHooks(m *metrics.Metrics, stage, name string) queue.Hooks {
	consuming := m.Consuming.WithLabelValues(name)
	consuming.Set(0)
	held := m.HeldBytes.WithLabelValues(name)
	pauses := m.ConsumerPauses.WithLabelValues(name) // the queue, as held bytes; the stage is klaxon_batches_total's
	return queue.Hooks{
		Connection: func(up bool) { consuming.Set(boolFloat(up)) },
		Batch: func(r queue.BatchResult) {
			outcome := "ok"
			if r.Err != nil {
				outcome = "error"
			}
			m.Batches.WithLabelValues(stage, outcome).Inc()
		},
		Held:   func(b int64) { held.Set(float64(b)) },
		Paused: pauses.Inc,
	}
}

// depths reports how many messages wait in each queue, every 5 s: how far
// behind the workers are.
func depths(ctx context.Context, pub *queue.Publisher, queues []string, m *metrics.Metrics) error {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		for _, q := range queues {
			if n, err := pub.Depth(ctx, q); err == nil {
				m.QueueDepth.WithLabelValues(q).Set(float64(n))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// linger is KLAXON_BATCH_LINGER as the consumer takes it, where 0 means
// its default and none is negative.
func linger(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// runAll runs every task until ctx is cancelled or one fails, then cancels
// the others and waits for them.
func runAll(ctx context.Context, tasks []func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(tasks))
	for i, task := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := task(ctx); err != nil && !errors.Is(err, context.Canceled) {
				errs[i] = err
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// eventIDUnknown is logged at start when links need the event's id and
// nothing can give it: every message then links as the fallback says.
const eventIDUnknown = "KLAXON_EVENT_URL links by {eventId}, the event's id in Hawk's events database, and KLAXON_EVENTS_MONGO_URL is not set: messages link to KLAXON_EVENT_URL_FALLBACK (none: no link)"
