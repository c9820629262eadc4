package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// Config is one chaos run.
type Config struct {
	Worker    string        // path of the worker binary (go build -o … ./cmd/worker)
	Workers   int           // processes on the queue at once
	Events    int           // events to generate (about; dropped groups take theirs along)
	Groups    int           // event groups to generate
	KillEvery time.Duration // mean interval between kills (exponentially distributed); 0 = no kills
	Rate      int           // events published per second; 0 = as fast as possible
	Seed      uint64        // events, rules' groups and kill intervals
	Timeout   time.Duration // the whole run
	// Quiet is how long the webhook must have been silent, with every queue
	// empty, before the run stops the workers and counts [3 s].
	Quiet    time.Duration
	AMQPURL  string
	RedisURL string // single node, redis+sentinel:// or redis+cluster://, as the workers take it
	// Fault is a Redis fault injected while events flow, besides the kills:
	// FaultFailover (a SENTINEL FAILOVER, RedisURL a Sentinel one) or
	// FaultReshard (redis-cli --cluster reshard of ReshardSlots slots,
	// RedisURL a Cluster one); each waits FaultEvery [5 s] after the last
	// one settled.
	Fault        string
	FaultEvery   time.Duration
	ReshardSlots int // [200]
	// WaitReplicas is the workers' KLAXON_REDIS_WAIT_REPLICAS [0].
	WaitReplicas int
	// BatchesInFlight is the workers' KLAXON_BATCHES_IN_FLIGHT [their
	// default].
	BatchesInFlight int
	// BatchLinger is the workers' KLAXON_BATCH_LINGER ("0", "2ms") [their
	// default].
	BatchLinger string
	// LogLevel is the workers' KLAXON_LOG_LEVEL [info]: the checker reads
	// their "notification sent" lines, which say whether the send was
	// recorded.
	LogLevel string
	// Dir holds the rules file and the workers' logs; "" makes a temporary
	// directory, removed after a clean run unless Keep.
	Dir  string
	Keep bool
	Log  *slog.Logger // progress [discarded]
}

// Result is what a run saw. Missed, Extra and Bad must be zero, and so must
// UnexpectedExits and Unsettled; Repeats are the one allowed exception.
type Result struct {
	Seed          uint64 `json:"seed"`
	Events        int    `json:"events"`
	Groups        int    `json:"groups"`
	GroupsKept    int    `json:"groupsKept"`
	GroupsDropped int    `json:"groupsDropped"`
	Orders        int    `json:"ordersChecked"`
	Workers       int    `json:"workers"`
	Kills         int    `json:"kills"`
	Fault         string `json:"fault,omitempty"`
	Faults        int    `json:"faults"` // failovers or reshards injected
	// MasterChanges is how many times the sentinels changed the master
	// during the chaos phase (failover); above Faults, they failed over by
	// themselves too: a second failure, outside what WAIT covers.
	MasterChanges int `json:"masterChanges,omitempty"`
	WaitReplicas  int `json:"waitReplicas"`
	InFlight      int `json:"batchesInFlight,omitempty"`
	Starts        int `json:"starts"`
	Expected      int `json:"expected"`
	Received      int `json:"received"` // webhook requests
	Missed        int `json:"missed"`   // expected ids never received
	Extra         int `json:"extra"`    // received ids not expected
	// Repeats counts the copies beyond the first of expected ids.
	Repeats int `json:"repeats"`
	// RepeatsAfterKill counts the repeats whose previous copy came from a
	// worker SIGKILLed before it could record the send: gone already when
	// the sink looked it up (and a worker was killed between the connection
	// and the lookup), or killed within crashWindow of the sink reading the
	// request, or before the end of a Redis fault under way then (writes
	// are not acknowledged until it is over); and whose next copy waited
	// for the dead sender's claim to expire. That is the window
	// docs/contract.md §4.5 allows: the provider took the message, Klaxon
	// never learnt it. Every repeat must be one of these, or one of
	// RepeatsUnrecorded.
	RepeatsAfterKill int `json:"repeatsAfterKill"`
	// RepeatsUnrecorded counts the other repeats whose previous copy's
	// sender logged that Redis refused to record its send (a failover under
	// way), and whose next copy came once its claim had lapsed: a second job
	// carrying the same firing, taken meanwhile by another worker
	// (docs/guarantees.md, Redis Sentinel failover).
	RepeatsUnrecorded int `json:"repeatsUnrecorded"`
	// Bad counts requests whose body is not the notification its
	// Idempotency-Key names (project, rule, group, firedAt), or that were
	// not a POST to the webhook's path.
	Bad int `json:"bad"`
	// LogChecked counts the requests whose sender was never SIGKILLed, and
	// Unlogged those of them whose sender logged no "notification sent"
	// line saying whether it recorded the send. The checker explains
	// repeats by those lines (fleet.recorded, fleet.unrecorded): Unlogged
	// above zero means it cannot read them, and would take every repeat
	// with a kill nearby for a crash's.
	LogChecked      int      `json:"logChecked"`
	Unlogged        int      `json:"unlogged"`
	UnknownSender   int      `json:"unknownSender"` // requests not traced to a worker process
	Failed          int      `json:"failed"`        // messages left in <prefix>.failed
	Dead            int      `json:"dead"`          // messages left in <queue>.dead
	UnexpectedExits []string `json:"unexpectedExits,omitempty"`
	Unsettled       string   `json:"unsettled,omitempty"` // why the queues never drained, if they did not

	Elapsed time.Duration `json:"-"`
	Publish time.Duration `json:"-"` // until every event was confirmed
	Chaos   time.Duration `json:"-"` // until the incoming queue was empty and kills stopped
	Settle  time.Duration `json:"-"` // from then until counted

	Dropped        []string `json:"droppedSample,omitempty"`
	Missing        []string `json:"missedSample,omitempty"`
	UnloggedSample []string `json:"unloggedSample,omitempty"` // "<id> from <sender>"
	Extras         []string `json:"extraSample,omitempty"`
	Repeated       []repeat `json:"repeated,omitempty"`
	Queue          string   `json:"queue"`
	Prefix         string   `json:"prefix"`
	LogDir         string   `json:"logDir,omitempty"` // kept after a failed run
}

// repeat describes one expected id received more than once.
type repeat struct {
	ID     string `json:"id"`
	Copies int    `json:"copies"`
	Sender string `json:"firstSender"`
	// Senders sent the copies, in order of arrival.
	Senders []string `json:"senders"`
	// KilledAfter is how long after the first copy arrived its sender was
	// SIGKILLed (negative: killed after it wrote the request, before the
	// sink read it); empty if it never was, or the sender is unknown.
	KilledAfter string `json:"killedAfter,omitempty"`
	Gap         string `json:"gap"` // between the first and second copies
}

// OK reports whether the run upheld docs/contract.md §4.5.
func (r *Result) OK() bool {
	return r.Missed == 0 && r.Extra == 0 && r.Bad == 0 && len(r.UnexpectedExits) == 0 && r.Unsettled == "" &&
		r.Repeats == r.RepeatsAfterKill+r.RepeatsUnrecorded && r.Failed == 0 && r.Dead == 0
}

// MarshalJSON adds the durations in seconds.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	return json.Marshal(struct {
		plain
		Elapsed float64 `json:"elapsedSeconds"`
		Publish float64 `json:"publishSeconds"`
		Chaos   float64 `json:"chaosSeconds"`
		Settle  float64 `json:"settleSeconds"`
	}{plain(r), r.Elapsed.Seconds(), r.Publish.Seconds(), r.Chaos.Seconds(), r.Settle.Seconds()})
}

func (c *Config) defaults() error {
	if c.Worker == "" {
		return errors.New("the worker binary is required (-worker)")
	}
	if _, err := os.Stat(c.Worker); err != nil {
		return fmt.Errorf("worker binary: %w", err)
	}
	if c.Workers < 1 {
		return fmt.Errorf("workers %d: want at least 1", c.Workers)
	}
	if c.KillEvery < 0 {
		return fmt.Errorf("kill-every %s: want 0 (no kills) or more", c.KillEvery)
	}
	if c.FaultEvery <= 0 {
		c.FaultEvery = 5 * time.Second
	}
	if c.ReshardSlots == 0 {
		c.ReshardSlots = 200
	}
	if c.WaitReplicas < 0 {
		return fmt.Errorf("wait-replicas %d: want 0 or more", c.WaitReplicas)
	}
	if c.BatchesInFlight < 0 {
		return fmt.Errorf("batches-in-flight %d: want 0 (the workers' default) or more", c.BatchesInFlight)
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Minute
	}
	if c.Quiet <= 0 {
		c.Quiet = 3 * time.Second
	}
	switch c.LogLevel {
	case "":
		c.LogLevel = "info"
	case "info", "debug":
	default:
		return fmt.Errorf("log-level %q: want info or debug, which log the sends the checker reads", c.LogLevel)
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Run runs one chaos run. An error means the run could not be carried out
// (services, setup, timeout); a finding is in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	log := cfg.Log

	runID := strings.ToLower(rand.Text()[:10])
	res := &Result{Seed: cfg.Seed, Workers: cfg.Workers, Groups: cfg.Groups, Fault: cfg.Fault, WaitReplicas: cfg.WaitReplicas, InFlight: cfg.BatchesInFlight,
		Queue: "klaxon-chaos." + runID, Prefix: "klaxon-chaos-" + runID}

	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "klaxon-chaos-*")
		if err != nil {
			return nil, fmt.Errorf("log directory: %w", err)
		}
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("log directory: %w", err)
	}

	redisOpts, err := config.Config{RedisURL: cfg.RedisURL}.RedisOptions()
	if err != nil {
		return nil, err
	}
	var fault faulter
	if cfg.Fault != FaultNone {
		if fault, err = newFaulter(cfg.Fault, redisOpts, cfg.ReshardSlots); err != nil {
			return nil, err
		}
	}
	rdb := redisOpts.NewClient()
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	b, err := dialBroker(cfg.AMQPURL)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	qs := queuesOf(res.Prefix)
	allQueues := append([]string{res.Queue, wire.DeadQueue(res.Queue), qs.deliveries, qs.bulk, qs.failed}, qs.retries...)
	// Everything the run made goes, whatever happened.
	defer func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer ccancel()
		if err := errors.Join(deleteKeys(cctx, rdb, res.Prefix), b.Delete(cctx, allQueues...)); err != nil {
			log.Error("clean up", "error", err)
		}
	}()

	settings := map[string]string{
		"KLAXON_AMQP_URL":     cfg.AMQPURL,
		"KLAXON_REDIS_URL":    cfg.RedisURL,
		"KLAXON_QUEUE":        res.Queue,
		"KLAXON_PREFIX":       res.Prefix,
		"KLAXON_RULES_FILE":   filepath.Join(dir, "rules.yaml"),
		"KLAXON_SEND_TIMEOUT": sendTimeout.String(),
		"KLAXON_LOG_LEVEL":    cfg.LogLevel,
		// Redis faults: a batch waits for this many replicas.
		"KLAXON_REDIS_WAIT_REPLICAS": fmt.Sprint(cfg.WaitReplicas),
		// The sink listens on loopback: endpoints from rules reach it only
		// when the operator allows it.
		"KLAXON_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8,::1/128",
	}
	if cfg.BatchesInFlight > 0 {
		settings["KLAXON_BATCHES_IN_FLIGHT"] = fmt.Sprint(cfg.BatchesInFlight)
	}
	if cfg.BatchLinger != "" {
		settings["KLAXON_BATCH_LINGER"] = cfg.BatchLinger
	}
	f := newFleet(cfg.Worker, workerEnv(settings), dir, cfg.Workers, log)
	s, err := newSink(f.pids)
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer scancel()
		_ = s.close(sctx)
	}()
	defer f.stopAll(context.WithoutCancel(ctx)) // a no-op after a finished run

	rulesOf, err := writeRules(ctx, filepath.Join(dir, "rules.yaml"), ruleSpecs(s.URL))
	if err != nil {
		return nil, err
	}
	p, err := makePlan(cfg.Seed, runID, cfg.Events, cfg.Groups, rulesOf, time.Now())
	if err != nil {
		return nil, err
	}
	res.Events, res.GroupsKept, res.GroupsDropped, res.Orders = len(p.Messages), p.Kept, p.Groups-p.Kept, p.Orders
	res.Expected, res.Dropped = len(p.Expected), p.Dropped
	log.Info("plan", "events", res.Events, "groups_kept", p.Kept, "groups_dropped", res.GroupsDropped, "expected", res.Expected)

	if err := b.Declare(ctx, res.Queue, nil); err != nil {
		return nil, err
	}
	if err := f.startAll(); err != nil {
		return nil, err
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	err = f.waitReady(rctx, b, res.Queue, qs.deliveries)
	rcancel()
	if err != nil {
		return nil, fmt.Errorf("%w (logs in %s)", err, dir)
	}

	// Chaos: publish while the killer runs; it stops once the incoming
	// queue is empty.
	chaosStart := time.Now()
	kctx, kcancel := context.WithCancel(ctx)
	killerDone := make(chan error, 2)
	go func() {
		if cfg.KillEvery == 0 {
			<-kctx.Done()
			killerDone <- kctx.Err()
			return
		}
		killerDone <- killer(kctx, f, cfg.Workers, cfg.KillEvery, mrand.New(mrand.NewPCG(cfg.Seed, 0x6b696c6c)))
	}()
	go func() {
		if fault == nil {
			<-kctx.Done()
			killerDone <- kctx.Err()
			return
		}
		var err error
		res.Faults, err = faults(kctx, fault, cfg.FaultEvery, f.faulted, log)
		killerDone <- err
	}()
	// Master changes are counted from the first fault to the end of the
	// settle phase: a second failover in any of it may lose writes.
	masterChanges := func() int { return 0 }
	if fo, ok := fault.(*failover); ok {
		masterChanges = fo.watch(ctx)
	}
	pubErr := b.publish(ctx, res.Queue, p.Messages, cfg.Rate)
	res.Publish = time.Since(chaosStart)
	if pubErr == nil {
		log.Info("published", "events", len(p.Messages), "took", res.Publish)
		pubErr = waitEmpty(ctx, b, res.Queue)
	}
	kcancel()
	for range 2 {
		if err := <-killerDone; err != nil && !errors.Is(err, context.Canceled) {
			pubErr = errors.Join(pubErr, err)
		}
	}
	if pubErr != nil {
		f.stopAll(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("chaos phase: %w (logs in %s)", pubErr, dir)
	}
	res.Chaos = time.Since(chaosStart)
	_, kills, _ := f.counts()
	log.Info("kills stopped: the incoming queue is empty", "kills", kills, "took", res.Chaos)

	settleStart := time.Now()
	work := append([]string{res.Queue, qs.deliveries, qs.bulk}, qs.retries...)
	res.Unsettled = settle(ctx, f, b, s, work, cfg.Quiet, log)
	res.Settle = time.Since(settleStart)
	res.MasterChanges = masterChanges()

	res.Starts, res.Kills, res.UnexpectedExits = f.counts()
	compare(res, p, s.requests(), f)
	if res.Failed, err = b.depth(ctx, qs.failed); err != nil {
		return nil, err
	}
	if res.Dead, err = b.depth(ctx, res.Queue+".dead"); err != nil {
		return nil, err
	}
	res.Elapsed = time.Since(start)
	if !res.OK() || cfg.Keep {
		res.LogDir = dir
	} else if cfg.Dir == "" {
		_ = os.RemoveAll(dir)
	}
	return res, nil
}

// killer SIGKILLs a random worker at random intervals (exponential, mean
// every) and starts another in its place at once, so every slot has a
// process nearly all the time. One kill in five is followed, within a
// quarter of the interval, by a kill of the newcomer while it starts.
func killer(ctx context.Context, f *fleet, n int, every time.Duration, rng *mrand.Rand) error {
	for {
		d := time.Duration(rng.ExpFloat64() * float64(every))
		d = min(max(d, every/20), 4*every)
		if err := pause(ctx, d); err != nil {
			return err
		}
		slot := rng.IntN(n)
		if err := f.kill(ctx, slot); err != nil {
			return err
		}
		if rng.IntN(5) == 0 {
			if err := pause(ctx, time.Duration(rng.Int64N(int64(every/4)+1))); err != nil {
				return err
			}
			if err := f.kill(ctx, slot); err != nil {
				return err
			}
		}
	}
}

// waitEmpty polls until queue has no ready message.
func waitEmpty(ctx context.Context, b *broker, queue string) error {
	for {
		d, err := b.depth(ctx, queue)
		if err != nil {
			return err
		}
		if d == 0 {
			return nil
		}
		if err := pause(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("%s still holds %d events: %w", queue, d, err)
		}
	}
}

// settle waits until the work is done: every queue of work empty and the
// webhook silent for quiet. It then stops the workers (SIGTERM), which
// gives back whatever they held unacked, and checks the queues again; if
// something came back it starts the workers again and waits once more. It
// returns "" once the queues stay empty with no worker running, else why not.
func settle(ctx context.Context, f *fleet, b *broker, s *sink, work []string, quiet time.Duration, log *slog.Logger) string {
	for round := 1; ; round++ {
		if why := waitQuiet(ctx, b, s, work, quiet); why != "" {
			return why
		}
		log.Info("quiet: stopping the workers", "round", round)
		stopStart := time.Now()
		f.stopAll(ctx)
		log.Info("workers stopped", "took", time.Since(stopStart))
		total, first, err := b.depths(ctx, work)
		if err != nil {
			return err.Error()
		}
		if total == 0 {
			return ""
		}
		log.Warn("work came back when the workers stopped; running them again", "round", round, "queue", first)
		if round == 5 {
			return fmt.Sprintf("queues still not empty after %d rounds (%s)", round, first)
		}
		if err := f.resume(); err != nil {
			return err.Error()
		}
	}
}

// waitQuiet polls until the queues are empty and the sink has been silent
// for quiet; it returns "" then, or what it was still waiting for when ctx ended.
func waitQuiet(ctx context.Context, b *broker, s *sink, queues []string, quiet time.Duration) string {
	since := time.Now()
	for {
		total, first, err := b.depths(ctx, queues)
		if err != nil {
			return err.Error()
		}
		last := s.lastRequest()
		if total > 0 {
			since = time.Now()
		}
		if last.After(since) {
			since = last
		}
		idle := time.Since(since)
		if total == 0 && idle >= quiet {
			return ""
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			if total > 0 {
				name, _, _ := strings.Cut(first, ":")
				held, _ := b.peek(name, 3)
				return fmt.Sprintf("queues not empty when the run timed out (%s: %s)", first, strings.Join(held, ", "))
			}
			return fmt.Sprintf("webhook still busy when the run timed out (last request %s ago)", time.Since(last).Round(time.Millisecond))
		}
	}
}
