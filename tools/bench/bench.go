package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// bench is one run's shared state.
type bench struct {
	o      options
	prefix string // of every queue and key of the run
	queue  string // the plain events queue, KLAXON_QUEUE
	// The incoming queues of the layout being measured: the plain queue,
	// or the hashed queues behind exchange.
	incoming  []string
	exchange  string
	dir       string
	rulesYML  string
	work      *workload
	bodies    [][]byte // round 0 of the workload, as published
	sink      *sink
	rdb       *redis.Client
	br        *broker
	prog      *progress
	http      *http.Client
	redisPID  int
	beamPID   int
	queues    []string // to delete at the end
	exchanges []string
	// Whether the Redis memory and the profile, taken on the first Klaxon
	// run only, are done.
	memoryDone, profileDone bool
}

// newBench is a run's state before it has connected to anything: the
// prefix of its queues and keys is unique to it.
func newBench(o options, stderr io.Writer) *bench {
	b := &bench{o: o, prog: newProgress(stderr, o.progress), http: &http.Client{Timeout: 30 * time.Second}}
	b.prefix = "kbench-" + strings.ToLower(rand.Text()[:10])
	b.queue = b.prefix + ".events"
	return b
}

// makeDir makes the run's temporary directory, for the worker binary,
// the rules file and the worker logs.
func (b *bench) makeDir() error {
	var err error
	if b.dir, err = os.MkdirTemp("", "klaxon-bench-"); err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	return nil
}

// removeDir removes the run's directory if *err is nil; after a failure it
// keeps it, for the worker logs, and adds where it is to *err.
func (b *bench) removeDir(err *error) {
	if *err == nil {
		os.RemoveAll(b.dir)
	} else {
		*err = fmt.Errorf("%w (worker logs kept in %s)", *err, b.dir)
	}
}

// connect opens the run's Redis client and its broker connections. close
// closes whatever it opened, even when it failed halfway.
func (b *bench) connect() error {
	ropts, err := redis.ParseURL(b.o.redisURL)
	if err != nil {
		return fmt.Errorf("-redis: %w", err)
	}
	b.rdb = redis.NewClient(ropts)
	b.br, err = dialBroker(b.o.amqpURL, b.o.queueType)
	return err
}

func (b *bench) close() {
	if b.br != nil {
		b.br.Close()
	}
	if b.rdb != nil {
		b.rdb.Close()
	}
}

// buildWorker builds ./cmd/worker into the run's directory, once, unless
// -worker named a binary.
func (b *bench) buildWorker(ctx context.Context) error {
	if b.o.workerBin != "" {
		return nil
	}
	b.prog.note("building ./cmd/worker")
	var err error
	b.o.workerBin, err = buildWorker(ctx, b.dir)
	return err
}

// workerEnv is a worker's environment: the services, the events queue, the
// rules file and kprefix, then own (what the measurement sets), then -env,
// which wins over both.
func (b *bench) workerEnv(kprefix string, own map[string]string) map[string]string {
	env := map[string]string{
		"KLAXON_AMQP_URL":   b.o.amqpURL,
		"KLAXON_QUEUE":      b.queue,
		"KLAXON_REDIS_URL":  b.o.redisURL,
		"KLAXON_RULES_FILE": b.rulesYML,
		"KLAXON_PREFIX":     kprefix,
	}
	maps.Copy(env, own)
	maps.Copy(env, b.o.workerEnv)
	return env
}

// workerQueues are the queues a worker with KLAXON_PREFIX kprefix declares
// of its own, for the cleanup.
func workerQueues(kprefix string) []string {
	qs := []string{wire.DeliveryQueue(kprefix), wire.BulkQueue(kprefix), wire.FailedQueue(kprefix)}
	for _, d := range wire.RetryDelays() {
		qs = append(qs, wire.RetryQueue(kprefix, d))
	}
	return qs
}

// measureRulesLoad loads and compiles the rules file as the worker does
// at every KLAXON_RULES_REFRESH, and says what one load costs.
func measureRulesLoad(ctx context.Context, path string) (*RulesLoad, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("rules file: %w", err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	specs, err := store.NewFileSource(path).Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("load rules file: %w", err)
	}
	snap := store.Compile(specs, start)
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	return &RulesLoad{Bytes: st.Size(), Rules: snap.Len(), Millis: float64(took.Microseconds()) / 1000,
		AllocBytes: int64(after.TotalAlloc - before.TotalAlloc)}, nil
}

// cleanup deletes the run's queues and Redis keys, even after ctx ended.
func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := deleteKeys(ctx, b.rdb, b.prefix); err != nil {
		b.prog.note("cleanup: %v", err)
	}
	// Last: without a broker, Delete keeps reconnecting until ctx ends.
	if err := b.br.Delete(ctx, b.queues...); err != nil {
		b.prog.note("cleanup: %v", err)
	}
	if err := b.br.deleteExchanges(b.exchanges...); err != nil {
		b.prog.note("cleanup: %v", err)
	}
}

// layout sets the incoming queues up for a run with nq of them: the plain
// queue for 1, else nq hashed queues behind the exchange.
func (b *bench) layout(ctx context.Context, nq int) error {
	if nq == 1 {
		b.incoming, b.exchange = []string{b.queue}, ""
		return nil
	}
	b.exchange = wire.HashExchange(b.queue)
	b.incoming = nil
	for i := range nq {
		b.incoming = append(b.incoming, wire.HashedQueue(b.queue, i))
	}
	b.queues = append(b.queues, b.incoming...)
	if !slices.Contains(b.exchanges, b.exchange) {
		b.exchanges = append(b.exchanges, b.exchange)
	}
	if err := b.br.hashed(ctx, b.exchange, b.incoming, b.incomingArgs()); err != nil {
		return fmt.Errorf("-queues %d: %w", nq, err)
	}
	return nil
}

// pacer publishes total events at rate as -latency-publish says.
func (b *bench) pacer(rate float64, total int) pacer {
	return pacer{rate: rate, total: total, transient: b.o.latencyPublish == "hawk"}
}

// incomingArgs are the arguments of the incoming queues the bench makes;
// the workers use them as they are.
func (b *bench) incomingArgs() amqp.Table {
	if b.o.queueMode == "" {
		return nil
	}
	return amqp.Table{"x-queue-mode": b.o.queueMode}
}

// message is event body routed as the layout wants: to the plain queue, or
// to the exchange keyed by its groupHash.
func (b *bench) message(groupHash string, body []byte) queue.Message {
	if b.exchange == "" {
		return queue.Message{RoutingKey: b.queue, ContentType: "application/json", Body: body}
	}
	return queue.Message{Exchange: b.exchange, RoutingKey: groupHash, ContentType: "application/json", Body: body}
}

// fill empties the incoming queues and publishes round 0 of the workload.
func (b *bench) fill(ctx context.Context, label string) error {
	for _, q := range b.incoming {
		if err := b.br.purge(q); err != nil {
			return err
		}
	}
	done := b.prog.phase("fill for "+label, int64(b.o.events))
	return b.br.fill(ctx, b.o.events, 2000, func(i int) queue.Message { return b.message(b.work.groupHash(i), b.bodies[i]) }, done)
}

// readyAll is how many messages the incoming queues hold ready.
func (b *bench) readyAll() (int, error) {
	total := 0
	for _, q := range b.incoming {
		n, err := b.br.ready(q)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// meter samples CPU of the consumer, Redis and the broker, and Redis' INFO.
type meter struct {
	b     *bench
	procs cpuSet
	cpu   map[string]time.Duration
	info  redisInfo
}

// hostProcs are the processes a latency phase's load is told apart for:
// the broker, Redis, and this bench, which publishes, receives the
// webhooks and, for the floor, consumes.
func (b *bench) hostProcs() cpuSet {
	return cpuSet{"broker": {b.beamPID}, "redis": {b.redisPID}, "bench": {os.Getpid()}}
}

func (b *bench) meter(consumer ...int) *meter {
	return &meter{b: b, procs: cpuSet{"worker": consumer, "redis": {b.redisPID}, "broker": {b.beamPID}}}
}

func (m *meter) begin(ctx context.Context) error {
	m.cpu = m.procs.sample()
	var err error
	m.info, err = readInfo(ctx, m.b.rdb)
	return err
}

// finish fills res' Redis and CPU figures per event, for events events.
func (m *meter) finish(ctx context.Context, res *Result, events int) error {
	info, err := readInfo(ctx, m.b.rdb)
	if err != nil {
		return err
	}
	cpu := m.procs.sample()
	res.Redis = diffInfo(m.info, info)
	n := float64(max(events, 1))
	res.PerEvent = PerEvent{
		RoundTrips: float64(res.Redis.RoundTrips) / n,
		Commands:   float64(res.Redis.Commands) / n,
		Scripts:    float64(res.Redis.Scripts) / n,
		WorkerCPU:  float64((cpu["worker"] - m.cpu["worker"]).Microseconds()) / n,
		RedisCPU:   float64((cpu["redis"] - m.cpu["redis"]).Microseconds()) / n,
		BrokerCPU:  float64((cpu["broker"] - m.cpu["broker"]).Microseconds()) / n,
	}
	return nil
}

// queuesLabel names the layout in progress lines: "" for one queue.
func (b *bench) queuesLabel() string {
	if len(b.incoming) == 1 {
		return ""
	}
	return fmt.Sprintf(", %d queues", len(b.incoming))
}

// waitEmpty waits, up to timeout, until queue has no message ready.
func (b *bench) waitEmpty(ctx context.Context, queue string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if n, err := b.br.ready(queue); err != nil || n == 0 {
			return
		}
		if sleep(ctx, 20*time.Millisecond) != nil {
			return
		}
	}
}

// waitQuiet waits, up to timeout, until the sink has received nothing new
// for quiet.
func (b *bench) waitQuiet(ctx context.Context, quiet, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	last, since := b.sink.received.Load(), time.Now()
	for time.Now().Before(deadline) && time.Since(since) < quiet {
		if sleep(ctx, 20*time.Millisecond) != nil {
			return
		}
		if n := b.sink.received.Load(); n != last {
			last, since = n, time.Now()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
