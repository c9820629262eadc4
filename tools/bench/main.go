// Command bench measures Klaxon's throughput against the broker's ceiling
// and a Hawk-style baseline, side by side in one run, on the same queue of
// generated Hawk events, and prints one table (or JSON with -json):
//
//	go run ./tools/bench                         # 100,000 events, ceiling, Hawk, Klaxon ×1,2,3
//	go run ./tools/bench -events 20000 -workers 1 -json
//	go run ./tools/bench -scale                  # 1,000 projects × 10 rules, 100,000 groups
//	go run ./tools/bench -queues 1,2,4 -systems ceiling,klaxon -workers 1,2
//
// For each system the queue is filled with the same N events first, then
// consumed:
//
//   - bare consumer: acks only (prefetch 1000, a multiple-ack every 100);
//     the most any consumer of this broker can do.
//   - Hawk-style: per event and per matching rule one EVALSHA of Hawk's
//     fixed-window script (hawk.lua), each message acked on its own.
//   - Klaxon: 1, 2, 3… worker processes of the real binary (./cmd/worker),
//     rules from a YAML file (no MongoDB), webhooks to a sink the bench
//     serves. The rate is taken from the moment every worker is ready to
//     the last ack. Then events are published at half that rate for a
//     while, with latency probes (ONLY_NEW events of new groups, so each
//     notifies) whose publish→webhook time gives p50/p95/p99.
//     The bare consumer is timed the same way, every message from publish
//     to delivery: the floor any system's latency stands on.
//
// With -queues N above 1 the events go through the consistent-hash exchange
// into N hashed queues, keyed by groupHash (KLAXON_QUEUE_SHARDS=N): the
// bare consumer reads the N queues at once, one connection each, and the
// workers consume all of them. Hawk-style runs with one queue only.
//
// With -big-messages N it measures one thing instead: what a backlog of
// big messages costs a worker in memory. It fills a queue of its own with
// N persistent messages of -big-mib MiB (each over the 256 KiB an event may
// have, so each is dead-lettered), confirmed one by one, starts the real
// worker on it with an empty rules file, waits until the worker's
// klaxon_events_total{outcome="dead"} reaches N, and prints the worker's
// peak resident set (VmHWM) and the time from its start. Of the other
// flags only -amqp, -redis, -worker, -env and -progress apply:
//
//	go run ./tools/bench -big-messages 60 -big-mib 10                                  # KLAXON_MAX_HELD_BYTES at its default
//	go run ./tools/bench -big-messages 60 -big-mib 10 -env KLAXON_MAX_HELD_BYTES=16GiB # in effect no byte bound: the prefetch alone
//
// It needs Redis and RabbitMQ (single node; with -queues above 1, the
// rabbitmq_consistent_hash_exchange plugin), and Go to build the worker
// unless -worker names a binary. Every queue and Redis key it creates has
// a prefix unique to the run and is deleted at the end. The machine should
// be otherwise idle: the table shows the load average at start and end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// options are the command line's settings.
type options struct {
	events, projects, rules, groups int
	threshold                       int64
	newFraction                     float64 // of the groups whose first event is new
	seed                            int64
	workers                         []int
	queues                          []int    // incoming queue counts; 1 is the plain queue
	systems                         []string // of ceiling, hawk, klaxon, in that order
	amqpURL, redisURL               string
	workerBin                       string
	beforeBin                       string // another worker binary, measured with the first worker count too
	workerEnv                       map[string]string
	// queueType is the workers' KLAXON_QUEUE_TYPE: the bench makes the
	// events queue, so it makes it of the type the workers would.
	queueType queue.Type
	// queueMode is the incoming queues' x-queue-mode ("" or "lazy"):
	// what a policy gives them on RabbitMQ before 3.12 (docs/scaling.md).
	queueMode   string
	latency     time.Duration
	latencyRate float64 // events/s of the latency phase; 0: half the measured rate
	// latencyPublish is how the latency phase publishes: "persistent"
	// (persistent messages on a channel in confirm mode) or "hawk"
	// (transient messages, no confirms: Hawk's Worker.addTask).
	latencyPublish string
	probeRate      float64
	scale          bool
	json           bool
	jsonFile       string
	progress       string
	pprofFile      string
	pprofSeconds   int
	memory         bool // measure Redis memory after the first Klaxon run
	// bigMessages, above 0, asks for the big-messages mode instead of the
	// throughput run: that many messages of bigMiB MiB, given up on after
	// bigTimeout (see runBigMessages).
	bigMessages, bigMiB int
	bigTimeout          time.Duration
}

func defaultOptions() options {
	return options{
		events: 100_000, projects: 100, rules: 4, groups: 1000, threshold: 100, newFraction: 1, seed: 1,
		workers: []int{1, 2, 3}, queues: []int{1}, systems: []string{"ceiling", "hawk", "klaxon"},
		amqpURL: "amqp://guest:guest@127.0.0.1:5672/", redisURL: "redis://127.0.0.1:6379/0",
		latency: 5 * time.Second, latencyPublish: "persistent", probeRate: 200, progress: "auto", pprofSeconds: 5, memory: true,
		bigMiB: 10, bigTimeout: 5 * time.Minute,
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := defaultOptions()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.events, "events", o.events, "events in the queue for each system")
	fs.IntVar(&o.projects, "projects", o.projects, "projects")
	fs.IntVar(&o.rules, "rules", o.rules, "rules per project (k%4: 0-2 SEEN_MORE, 3 ONLY_NEW)")
	fs.IntVar(&o.groups, "groups", o.groups, "event groups (groupHash), spread over the projects; each gets an event, the rest are Zipf-distributed")
	fs.Int64Var(&o.threshold, "threshold", o.threshold, "lowest SEEN_MORE threshold (others are 2× and 10×)")
	fs.Int64Var(&o.seed, "seed", o.seed, "seed of the generated workload")
	fs.Float64Var(&o.newFraction, "new", o.newFraction, "fraction of the groups that are new (their first event has isNew); the others existed before")
	workers := fs.String("workers", "1,2,3", "Klaxon worker process counts to measure, comma-separated")
	queues := fs.String("queues", "1", "incoming queue counts to measure, comma-separated: 1 is one plain queue; N above 1 spreads the events by groupHash over N hashed queues (KLAXON_QUEUE_SHARDS=N)")
	systems := fs.String("systems", "ceiling,hawk,klaxon", "what to measure: ceiling, hawk, klaxon")
	fs.StringVar(&o.amqpURL, "amqp", o.amqpURL, "RabbitMQ URL")
	fs.StringVar(&o.redisURL, "redis", o.redisURL, "Redis URL (single node)")
	fs.StringVar(&o.workerBin, "worker", "", "worker binary; built from ./cmd/worker when empty")
	fs.StringVar(&o.beforeBin, "before", "", "another worker binary (say, built from the last commit) to measure side by side, with the first -workers count")
	fs.StringVar(&o.queueMode, "queue-mode", "", "lazy: make the incoming queues lazy (x-queue-mode), as docs/scaling.md's policy does on RabbitMQ before 3.12, which keeps a classic queue's backlog in memory; from 3.12 the broker ignores it")
	env := fs.String("env", "", "extra worker environment, comma-separated KLAXON_…=value or GO…=value (e.g. KLAXON_BATCH_SIZE=512,GOGC=200)")
	fs.DurationVar(&o.latency, "latency", o.latency, "how long to publish at half the measured rate for latency; 0 skips")
	fs.Float64Var(&o.probeRate, "probes", o.probeRate, "latency probes per second, at most")
	fs.Float64Var(&o.latencyRate, "latency-rate", 0, "events/s to publish for the latency measurement; 0 means half the rate just measured")
	fs.StringVar(&o.latencyPublish, "latency-publish", o.latencyPublish, "how the latency phase publishes: persistent (persistent messages, every one confirmed) or hawk (transient messages without confirms, as Hawk's workers send the notifier's)")
	fs.BoolVar(&o.scale, "scale", false, "scale run: 1,000 projects × 10 rules, 100,000 groups, 300,000 events, ceiling and Klaxon ×1 (flags given explicitly win)")
	fs.BoolVar(&o.json, "json", false, "print the results as JSON instead of a table")
	fs.StringVar(&o.jsonFile, "json-file", "", "also write the results as JSON to this file")
	fs.StringVar(&o.progress, "progress", o.progress, "progress on stderr: auto (a bar on a terminal, else a line per phase), bar, lines, off")
	fs.StringVar(&o.pprofFile, "pprof", "", "write a CPU profile of the first worker of the first Klaxon run to this file (and its heap allocations to FILE.allocs)")
	fs.IntVar(&o.pprofSeconds, "pprof-seconds", o.pprofSeconds, "length of the CPU profile")
	fs.BoolVar(&o.memory, "memory", o.memory, "measure Redis memory per key after the first Klaxon run")
	fs.IntVar(&o.bigMessages, "big-messages", 0, "instead of the throughput run: fill a queue with this many messages of -big-mib MiB, run one worker on it until it has dead-lettered them all, and print its peak RSS (VmHWM) and the time; only -amqp, -redis, -worker, -env and -progress apply with it")
	fs.IntVar(&o.bigMiB, "big-mib", o.bigMiB, "with -big-messages: the size of each message, MiB (over the 256 KiB an event may have)")
	fs.DurationVar(&o.bigTimeout, "big-timeout", o.bigTimeout, "with -big-messages: give up after this long")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := checkBigMessages(o, set); err != nil {
		return o, err
	}
	if o.scale {
		for name, apply := range map[string]func(){
			"projects": func() { o.projects = 1000 },
			"rules":    func() { o.rules = 10 },
			"groups":   func() { o.groups = 100_000 },
			"events":   func() { o.events = 300_000 },
			"workers":  func() { *workers = "1" },
			"systems":  func() { *systems = "ceiling,klaxon" },
			"latency":  func() { o.latency = 10 * time.Second },
			"new":      func() { o.newFraction = 0.1 },
		} {
			if !set[name] {
				apply()
			}
		}
	}
	var err error
	if o.workers, err = parseInts(*workers); err != nil {
		return o, fmt.Errorf("-workers: %w", err)
	}
	if o.queues, err = parseInts(*queues); err != nil {
		return o, fmt.Errorf("-queues: %w", err)
	}
	if slices.Max(o.queues) > 256 {
		return o, errors.New("-queues: at most 256, as KLAXON_QUEUE_SHARDS")
	}
	o.systems = nil
	for _, s := range []string{"ceiling", "hawk", "klaxon"} {
		if slices.Contains(strings.Split(*systems, ","), s) {
			o.systems = append(o.systems, s)
		}
	}
	if len(o.systems) == 0 {
		return o, fmt.Errorf("-systems %q names none of ceiling, hawk, klaxon", *systems)
	}
	o.workerEnv = map[string]string{}
	for kv := range strings.SplitSeq(*env, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, "KLAXON_") && !strings.HasPrefix(k, "GO") {
			return o, fmt.Errorf("-env %q: want KLAXON_NAME=value or GONAME=value", kv)
		}
		o.workerEnv[k] = v
	}
	o.queueType = queue.Classic
	if v, ok := o.workerEnv["KLAXON_QUEUE_TYPE"]; ok {
		if o.queueType, err = queue.ParseType(v); err != nil {
			return o, fmt.Errorf("-env KLAXON_QUEUE_TYPE: %w", err)
		}
	}
	switch {
	case o.events < 1, o.projects < 1, o.rules < 1, o.groups < 1:
		return o, errors.New("-events, -projects, -rules and -groups must be at least 1")
	case o.threshold < 1:
		return o, errors.New("-threshold must be at least 1")
	case o.probeRate <= 0:
		return o, errors.New("-probes must be positive")
	case o.newFraction < 0 || o.newFraction > 1:
		return o, errors.New("-new must be from 0 to 1")
	case o.latencyPublish != "persistent" && o.latencyPublish != "hawk":
		return o, fmt.Errorf("-latency-publish %q: want persistent or hawk", o.latencyPublish)
	case o.queueMode != "" && o.queueMode != "lazy":
		return o, fmt.Errorf("-queue-mode %q: want lazy, or nothing for the broker's default", o.queueMode)
	case o.queueMode != "" && o.queueType != queue.Classic:
		return o, fmt.Errorf("-queue-mode %s: only classic queues have a mode, and KLAXON_QUEUE_TYPE is %s", o.queueMode, o.queueType)
	}
	return o, nil
}

// bigMessagesFlags are the flags the big-messages mode reads.
var bigMessagesFlags = []string{"big-messages", "big-mib", "big-timeout", "amqp", "redis", "worker", "env", "progress"}

// checkBigMessages checks the big-messages flags against the flags set: a
// flag the chosen mode does not read would be silently ignored, so it is
// refused instead.
func checkBigMessages(o options, set map[string]bool) error {
	if !set["big-messages"] {
		for _, name := range []string{"big-mib", "big-timeout"} {
			if set[name] {
				return fmt.Errorf("-%s needs -big-messages", name)
			}
		}
		return nil
	}
	switch {
	case o.bigMessages < 1:
		return errors.New("-big-messages must be at least 1")
	case o.bigMiB < 1:
		return errors.New("-big-mib must be at least 1")
	case o.bigTimeout <= 0:
		return errors.New("-big-timeout must be positive")
	}
	for _, name := range slices.Sorted(maps.Keys(set)) {
		if !slices.Contains(bigMessagesFlags, name) {
			return fmt.Errorf("-%s does not apply with -big-messages", name)
		}
	}
	return nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a whole number of 1 or more", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = measure(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// measure runs the mode o asks for and prints its result on stdout: the
// big-messages line, or the report as a table or JSON.
func measure(ctx context.Context, o options) error {
	if o.bigMessages > 0 {
		line, err := runBigMessages(ctx, o, os.Stderr)
		if err != nil {
			return err
		}
		fmt.Println(line)
		return nil
	}
	rep, err := run(ctx, o, os.Stderr)
	if err != nil {
		return err
	}
	doc, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if o.jsonFile != "" {
		if err := os.WriteFile(o.jsonFile, append(doc, '\n'), 0o644); err != nil {
			return err
		}
	}
	if o.json {
		fmt.Println(string(doc))
		return nil
	}
	writeTable(os.Stdout, rep)
	return nil
}

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

// run measures every system o asks for and returns the report.
func run(ctx context.Context, o options, stderr io.Writer) (rep *Report, err error) {
	b := newBench(o, stderr)
	defer b.prog.end()
	rep = &Report{
		Started: time.Now().UTC(),
		Settings: Settings{Events: o.events, Projects: o.projects, Rules: o.rules, Groups: o.groups,
			Threshold: o.threshold, NewGroups: o.newFraction, Seed: o.seed, Workers: o.workers, Queues: o.queues, Latency: o.latency.String(), Prefix: b.prefix,
			QueueMode: o.queueMode, LatencyPublish: o.latencyPublish},
		Host: Host{Cores: runtime.NumCPU(), LoadStart: loadAverage(), Go: runtime.Version()},
	}

	if err := b.makeDir(); err != nil {
		return nil, err
	}
	defer b.removeDir(&err)
	if b.sink, err = startSink(); err != nil {
		return nil, fmt.Errorf("webhook sink: %w", err)
	}
	defer b.sink.close()

	b.work = newWorkload(o)
	yml, err := b.work.rulesYAML(b.sink.url)
	if err != nil {
		return nil, err
	}
	b.rulesYML = filepath.Join(b.dir, "rules.yaml")
	if err := os.WriteFile(b.rulesYML, yml, 0o600); err != nil {
		return nil, fmt.Errorf("write rules file: %w", err)
	}
	if rep.Rules, err = measureRulesLoad(ctx, b.rulesYML); err != nil {
		return nil, err
	}

	err = b.connect()
	defer b.close()
	if err != nil {
		return nil, err
	}
	info, err := readInfo(ctx, b.rdb)
	if err != nil {
		return nil, err
	}
	rep.Host.Redis = info.version
	if isProcess(info.processID, "redis-server") {
		b.redisPID = info.processID
	}
	rep.Host.RabbitMQ = b.br.version()
	b.beamPID = findProcess("/proc", "beam.smp", "rabbit", amqpPort(b.o.amqpURL))
	rep.Host.RedisPID, rep.Host.BrokerPID = b.redisPID, b.beamPID

	b.queues = append(b.queues, b.queue, b.queue+".dead", b.prefix+".hawk-out")
	defer b.cleanup()
	if err := b.br.Declare(ctx, b.queue, b.incomingArgs()); err != nil {
		return nil, err
	}

	b.bodies = make([][]byte, o.events)
	for i := range b.bodies {
		b.bodies[i] = b.work.body(0, i)
	}

	ceilings := map[int]float64{} // by queue count
	for _, nq := range o.queues {
		if err := b.layout(ctx, nq); err != nil {
			return nil, err
		}
		for _, system := range o.systems {
			switch system {
			case "ceiling":
				res, err := b.runCeiling(ctx)
				if err != nil {
					return nil, fmt.Errorf("bare consumer: %w", err)
				}
				ceilings[nq] = res.EventsPerSec
				rep.Results = append(rep.Results, res)
			case "hawk":
				if nq > 1 {
					continue // Hawk's notifier reads one queue
				}
				res, err := b.runHawk(ctx)
				if err != nil {
					return nil, fmt.Errorf("Hawk-style baseline: %w", err)
				}
				rep.Results = append(rep.Results, res)
			case "klaxon":
				if err := b.buildWorker(ctx); err != nil {
					return nil, err
				}
				if o.beforeBin != "" {
					res, _, err := b.runKlaxon(ctx, o.beforeBin, "before", o.workers[0])
					if err != nil {
						return nil, fmt.Errorf("Klaxon (-before) with %d worker%s: %w", o.workers[0], plural(o.workers[0]), err)
					}
					rep.Results = append(rep.Results, res)
				}
				for _, k := range o.workers {
					res, mem, err := b.runKlaxon(ctx, b.o.workerBin, "", k)
					if err != nil {
						return nil, fmt.Errorf("Klaxon with %d worker%s, %d queue%s: %w", k, plural(k), nq, plural(nq), err)
					}
					rep.Results = append(rep.Results, res)
					if mem != nil {
						rep.Memory = mem
					}
				}
			}
		}
	}
	for i := range rep.Results {
		if c := ceilings[rep.Results[i].Queues]; c > 0 {
			rep.Results[i].CeilingRatio = rep.Results[i].EventsPerSec / c
		}
	}
	rep.Host.LoadEnd = loadAverage()
	return rep, nil
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

// runCeiling consumes the incoming queues acking only: prefetch 1000, a
// multiple-ack every 100 deliveries; several queues at once, a connection
// each, as the workers do.
func (b *bench) runCeiling(ctx context.Context) (Result, error) {
	res := Result{System: "ceiling", Queues: len(b.incoming), Events: b.o.events, Consumed: b.o.events}
	if err := b.fill(ctx, "bare consumer"+b.queuesLabel()); err != nil {
		return res, err
	}
	counts := make([]int, len(b.incoming))
	for i, q := range b.incoming {
		n, err := b.br.ready(q)
		if err != nil {
			return res, err
		}
		counts[i] = n
	}
	conns := make([]*amqp.Connection, len(b.incoming))
	for i := range conns {
		conn, err := amqp.DialConfig(b.o.amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": "klaxon-bench-ceiling"}})
		if err != nil {
			return res, fmt.Errorf("connect to RabbitMQ: %w", err)
		}
		defer conn.Close()
		conns[i] = conn
	}
	m := b.meter(os.Getpid())
	if err := m.begin(ctx); err != nil {
		return res, err
	}
	done := b.prog.phase("bare consumer"+b.queuesLabel(), int64(b.o.events))
	spans := make([]span, len(b.incoming))
	errs := make([]error, len(b.incoming))
	var wg sync.WaitGroup
	for i, q := range b.incoming {
		if counts[i] == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			spans[i], errs[i] = consumeOn(ctx, conns[i], q, counts[i], 1000, nil, func(_ context.Context, ch *amqp.Channel, d *amqp.Delivery, last bool) error {
				n++
				done.Add(1)
				if n%100 == 0 || last {
					return ch.Ack(d.DeliveryTag, true)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if err := m.finish(ctx, &res, res.Events); err != nil {
		return res, err
	}
	var all span
	for i, sp := range spans {
		if counts[i] == 0 {
			continue
		}
		if all.first.IsZero() || sp.first.Before(all.first) {
			all.first = sp.first
		}
		if sp.last.After(all.last) {
			all.last = sp.last
		}
	}
	res.Seconds = all.seconds()
	res.EventsPerSec = float64(res.Events) / res.Seconds
	if b.o.latency > 0 {
		l, err := b.floorLatency(ctx, conns, b.latencyRate(res.EventsPerSec))
		if err != nil {
			return res, fmt.Errorf("floor latency: %w", err)
		}
		res.Latency = l
	}
	return res, nil
}

// latencyRate is the rate of a latency phase after a run at measured
// events/s: -latency-rate, or half the measured rate.
func (b *bench) latencyRate(measured float64) float64 {
	if b.o.latencyRate > 0 {
		return b.o.latencyRate
	}
	return measured / 2
}

// floorLatency is the broker's own part of the latency: the workload
// published at rate for the latency duration, as measureLatency does, and
// every message timed from its publish to its delivery to a bare consumer
// that acks it at once. No system can be faster on this broker and host.
func (b *bench) floorLatency(ctx context.Context, conns []*amqp.Connection, rate float64) (*Latency, error) {
	total := max(int(rate*b.o.latency.Seconds()), 1)
	l := &Latency{Rate: rate, Events: total, Probes: total}
	sent := make([]atomic.Int64, total) // UnixNano of each publish
	got := make([]atomic.Int64, total)  // of each delivery
	var received atomic.Int64
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, len(b.incoming))
	for i, q := range b.incoming {
		ch, err := conns[i].Channel()
		if err != nil {
			return nil, fmt.Errorf("open channel: %w", err)
		}
		defer ch.Close()
		if err := ch.Qos(1000, 0, false); err != nil {
			return nil, fmt.Errorf("qos: %w", err)
		}
		deliveries, err := ch.ConsumeWithContext(cctx, q, "", false, false, false, false, nil)
		if err != nil {
			return nil, fmt.Errorf("consume %s: %w", q, err)
		}
		go func() {
			for d := range deliveries {
				now := time.Now().UnixNano()
				if n, err := strconv.Atoi(d.MessageId); err == nil && n >= 0 && n < total {
					got[n].Store(now)
					received.Add(1)
				}
				if err := d.Ack(false); err != nil {
					errs <- fmt.Errorf("ack: %w", err)
					return
				}
			}
		}()
	}
	phase := b.prog.phase(fmt.Sprintf("floor latency at %s/s", thousands(rate)), int64(total))
	p := b.pacer(rate, total)
	span, err := loadWhile(b.hostProcs(), func() error {
		return p.run(ctx, b.br, func(i int) queue.Message {
			sent[i].Store(time.Now().UnixNano())
			m := b.message(b.work.groupHash(i), b.work.body(1, i))
			m.MessageID = strconv.Itoa(i)
			return m
		}, phase)
	})
	l.HostBusy, l.Cores = span.busy, span.cores()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for received.Load() < int64(total) && time.Now().Before(deadline) {
		select {
		case err := <-errs:
			return nil, err
		default:
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	lat := make([]time.Duration, 0, total)
	for i := range total {
		if g := got[i].Load(); g != 0 {
			lat = append(lat, time.Duration(g-sent[i].Load()))
		}
	}
	l.summarize(lat, nil)
	return l, nil
}

// queuesLabel names the layout in progress lines: "" for one queue.
func (b *bench) queuesLabel() string {
	if len(b.incoming) == 1 {
		return ""
	}
	return fmt.Sprintf(", %d queues", len(b.incoming))
}

// runHawk consumes the queue the way Hawk's notifier does (see hawkBaseline).
func (b *bench) runHawk(ctx context.Context) (Result, error) {
	res := Result{System: "hawk", Queues: 1, Events: b.o.events, Consumed: b.o.events}
	h, err := newHawkBaseline(ctx, b.rdb, b.rulesYML, b.prefix+":hawk", b.prefix+".hawk-out")
	if err != nil {
		return res, err
	}
	if err := b.br.Declare(ctx, h.out, nil); err != nil {
		return res, err
	}
	if err := b.fill(ctx, "Hawk-style"); err != nil {
		return res, err
	}
	m := b.meter(os.Getpid())
	if err := m.begin(ctx); err != nil {
		return res, err
	}
	done := b.prog.phase("Hawk-style", int64(b.o.events))
	sp, err := b.br.consumeAll(ctx, b.queue, b.o.events, 1000, nil, func(ctx context.Context, ch *amqp.Channel, d *amqp.Delivery, _ bool) error {
		done.Add(1)
		return h.handle(ctx, ch, d)
	})
	if err != nil {
		return res, err
	}
	if err := m.finish(ctx, &res, res.Events); err != nil {
		return res, err
	}
	res.Seconds = sp.seconds()
	res.EventsPerSec = float64(res.Events) / res.Seconds
	res.Notifications = int64(h.fired)
	return res, nil
}

// runKlaxon measures k worker processes: throughput on a full queue, then
// latency at half that rate. With memory it also measures Redis' memory
// for the run's keys.
func (b *bench) runKlaxon(ctx context.Context, bin, variant string, k int) (Result, *Memory, error) {
	nq := len(b.incoming)
	res := Result{System: "klaxon", Variant: variant, Workers: k, Queues: nq, Consumed: b.o.events}
	kprefix := fmt.Sprintf("%s-k%d", b.prefix, k)
	if variant != "" {
		kprefix = fmt.Sprintf("%s-%s%d", b.prefix, variant, k)
	}
	if nq > 1 {
		kprefix = fmt.Sprintf("%s-q%d", kprefix, nq)
	}
	b.queues = append(b.queues, workerQueues(kprefix)...)
	label := fmt.Sprintf("Klaxon ×%d", k)
	if variant != "" {
		label += " " + variant
	}
	label += b.queuesLabel()
	if err := b.fill(ctx, label); err != nil {
		return res, nil, err
	}
	measureMemory := !b.memoryDone && b.o.memory
	b.memoryDone = true
	var memBefore redisInfo
	if measureMemory {
		var err error
		if memBefore, err = readInfo(ctx, b.rdb); err != nil {
			return res, nil, err
		}
	}

	own := map[string]string{
		"KLAXON_LOG_LEVEL": "info",
		// The sink listens on loopback: endpoints from rules reach it only
		// when the operator allows it.
		"KLAXON_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8,::1/128",
	}
	if nq > 1 {
		own["KLAXON_QUEUE_SHARDS"] = strconv.Itoa(nq)
	}
	env := b.workerEnv(kprefix, own)
	profile := !b.profileDone && b.o.pprofFile != ""
	b.profileDone = true
	b.prog.note("starting %d worker%s", k, plural(k))
	var ws []*worker
	defer func() {
		for _, w := range ws {
			_ = w.stop()
		}
	}()
	for i := range k {
		wenv := env
		if profile && i == 0 {
			wenv = map[string]string{"KLAXON_PPROF": "true"}
			for key, v := range env {
				wenv[key] = v
			}
		}
		w, err := startWorker(bin, wenv, filepath.Join(b.dir, fmt.Sprintf("worker-k%d%s-%d.log", k, variant, i)))
		if err != nil {
			return res, nil, err
		}
		ws = append(ws, w)
	}
	for _, w := range ws {
		if err := w.waitReady(ctx, b.http, time.Minute); err != nil {
			return res, nil, err
		}
	}

	pids := make([]int, len(ws))
	for i, w := range ws {
		pids[i] = w.pid()
	}
	m := b.meter(pids...)
	if err := m.begin(ctx); err != nil {
		return res, nil, err
	}
	t0 := time.Now()
	start, err := sumMetrics(ctx, b.http, ws)
	if err != nil {
		return res, nil, err
	}
	notified := b.sink.received.Load()
	profDone := make(chan error, 1)
	if profile {
		go func() { profDone <- b.fetchProfiles(ctx, ws[0]) }()
	}

	done := b.prog.phase(label, int64(b.o.events))
	end, err := b.waitConsumed(ctx, ws, done)
	if err != nil {
		return res, nil, err
	}
	t1 := time.Now()
	res.Events = b.o.events - int(start["events"])
	if err := m.finish(ctx, &res, res.Events); err != nil {
		return res, nil, err
	}
	res.Seconds = t1.Sub(t0).Seconds()
	res.EventsPerSec = float64(res.Events) / res.Seconds
	res.Batches = end["batches"] - start["batches"]

	var mem *Memory
	if measureMemory {
		if mem, err = b.measureMemory(ctx, kprefix, memBefore, k); err != nil {
			return res, nil, err
		}
	}
	if profile {
		if err := <-profDone; err != nil {
			return res, nil, err
		}
	}
	// Let the notifications of the run arrive before counting them: the
	// delivery queue empty, then the sink quiet (jobs taken but not yet
	// sent are not in the queue's ready count).
	b.waitEmpty(ctx, wire.DeliveryQueue(kprefix), 10*time.Second)
	b.waitEmpty(ctx, wire.BulkQueue(kprefix), 10*time.Second)
	b.waitQuiet(ctx, time.Second, 10*time.Second)
	res.Notifications = b.sink.received.Load() - notified

	if b.o.latency > 0 {
		if res.Latency, err = b.measureLatency(ctx, kprefix, k, b.latencyRate(res.EventsPerSec), ws); err != nil {
			return res, nil, err
		}
	}
	for _, w := range ws {
		if rss, err := peakRSS(w.pid()); err == nil {
			res.WorkerRSS = max(res.WorkerRSS, rss)
		}
	}
	for _, w := range ws {
		if err := w.stop(); err != nil {
			return res, nil, err
		}
	}
	ws = nil
	return res, mem, nil
}

// waitConsumed waits until the workers have handled every event of the
// queue: it polls the queue's depth (cheap for the broker) while messages
// are ready, then the workers' klaxon_events_total until it reaches the
// number of events, and returns the final metrics. It fails if nothing
// moves for a minute.
func (b *bench) waitConsumed(ctx context.Context, ws []*worker, done *atomic.Int64) (map[string]float64, error) {
	last, lastMove := -1, time.Now()
	stalled := func(progress int) error {
		if progress != last {
			last, lastMove = progress, time.Now()
			return nil
		}
		if time.Since(lastMove) > time.Minute {
			return fmt.Errorf("no progress for a minute at %d of %d events; worker log: %s", progress, b.o.events, tail(ws[0].logPath, 10))
		}
		return nil
	}
	for {
		depth, err := b.readyAll()
		if err != nil {
			return nil, err
		}
		if depth == 0 {
			break
		}
		done.Store(int64(b.o.events - depth))
		if err := stalled(depth); err != nil {
			return nil, err
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	for {
		m, err := sumMetrics(ctx, b.http, ws)
		if err != nil {
			return nil, err
		}
		n := int(m["events"])
		done.Store(int64(n))
		if n >= b.o.events {
			return m, nil
		}
		if err := stalled(-n - 1); err != nil {
			return nil, err
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return nil, err
		}
	}
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

// measureLatency publishes the workload at rate for the latency duration,
// every so often a probe, and times each probe from publish to webhook.
// Over the same span it reads the workers' CPU an event, and how many
// notifications they put back for their turn.
func (b *bench) measureLatency(ctx context.Context, kprefix string, round int, rate float64, ws []*worker) (*Latency, error) {
	total := max(int(rate*b.o.latency.Seconds()), 1)
	every := max(int(rate/b.o.probeRate), 1)
	probes := (total + every - 1) / every
	l := &Latency{Rate: rate, Events: total, Probes: probes}
	b.sink.expect(kprefix, probes)
	sent := b.prog.phase(fmt.Sprintf("latency at %s/s", thousands(rate)), int64(total))
	p := b.pacer(rate, total)
	procs := b.hostProcs()
	for _, w := range ws {
		procs["worker"] = append(procs["worker"], w.pid())
	}
	before, err := sumMetrics(ctx, b.http, ws)
	if err != nil {
		return nil, err
	}
	span, err := loadWhile(procs, func() error {
		return p.run(ctx, b.br, func(i int) queue.Message {
			if i%every == 0 {
				b.sink.stamp(i / every)
				return b.message(probeGroup(kprefix, i/every), b.work.probeBody(kprefix, i/every))
			}
			return b.message(b.work.groupHash(i), b.work.body(round, i))
		}, sent)
	})
	l.HostBusy, l.Cores = span.busy, span.cores()
	if err != nil {
		return nil, err
	}
	l.WorkerCPU = float64(span.cpu["worker"].Microseconds()) / float64(total)
	got := b.prog.phase("latency probes", int64(probes))
	deadline := time.Now().Add(30 * time.Second)
	for {
		arrivals, _ := b.sink.latencies()
		n := len(arrivals)
		got.Store(int64(n))
		if n >= probes || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	l.summarize(b.sink.latencies())
	after, err := sumMetrics(ctx, b.http, ws)
	if err != nil {
		return nil, err
	}
	l.Deferred = int(after["deferred"] - before["deferred"])
	return l, nil
}

// measureMemory measures Redis' memory for the keys of one Klaxon run.
func (b *bench) measureMemory(ctx context.Context, kprefix string, before redisInfo, k int) (*Memory, error) {
	after, err := readInfo(ctx, b.rdb)
	if err != nil {
		return nil, err
	}
	// Klaxon's keys are "<KLAXON_PREFIX>:…"; the colon keeps another run's
	// prefix that merely starts the same out.
	stats, err := scanKeyStats(ctx, b.rdb, kprefix+":", 2000)
	if err != nil {
		return nil, err
	}
	m := &Memory{Workers: k, Events: b.o.events, Groups: b.o.groups,
		UsedDelta: after.usedMemory - before.usedMemory, Stats: stats}
	m.Keys = stats.States + stats.Pages + stats.Other
	if m.Keys > 0 {
		m.PerKey = float64(m.UsedDelta) / float64(m.Keys)
	}
	// What recognising redeliveries costs: ids inside state strings, and
	// the pages of busy groups, over the events counted.
	ids := stats.InlineBytes*float64(stats.States) + stats.PageBytes*float64(stats.Pages)
	m.DedupPerEvt = ids / float64(b.o.events)
	return m, nil
}

// fetchProfiles saves a CPU profile of the worker taken while it works, and
// its allocation profile after.
func (b *bench) fetchProfiles(ctx context.Context, w *worker) error {
	get := func(path, file string) error {
		client := &http.Client{Timeout: time.Duration(b.o.pprofSeconds+30) * time.Second}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+w.addr+path, nil)
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("profile %s: %w", path, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("profile %s: %s (is KLAXON_PPROF supported by this worker?)", path, resp.Status)
		}
		f, err := os.Create(file)
		if err != nil {
			return fmt.Errorf("profile file: %w", err)
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			return fmt.Errorf("write profile: %w", err)
		}
		return f.Close()
	}
	if err := get(fmt.Sprintf("/debug/pprof/profile?seconds=%d", b.o.pprofSeconds), b.o.pprofFile); err != nil {
		return err
	}
	return get("/debug/pprof/allocs", b.o.pprofFile+".allocs")
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
