package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
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
	// workload is the traffic generated: "hawk" (Hawk's messages, Zipf
	// over the groups) or "idless" (see newWorkload).
	workload     string
	json         bool
	jsonFile     string
	progress     string
	pprofFile    string
	pprofSeconds int
	memory       bool // measure Redis memory after the first Klaxon run
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
		bigMiB: 10, bigTimeout: 5 * time.Minute, workload: "hawk",
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
	fs.StringVar(&o.workload, "workload", o.workload, "traffic: hawk (Hawk's messages with repetitionIds, Zipf over the groups, -rules of four kinds) or idless (messages without message-id, repetitionId or timestamp, as producers other than Hawk send; defaults 200,000 events, 100 projects × 5 SEEN_MORE rules, 5,000 groups with 1% of them four times busier; windows of 1 h and 1 day, thresholds 1.5 to 3.5 × the mean events per group; flags given explicitly win)")
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
	if err := applyWorkload(&o, set); err != nil {
		return o, err
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

// applyWorkload checks -workload and gives the idless workload its
// defaults, under the flags given explicitly.
func applyWorkload(o *options, set map[string]bool) error {
	switch o.workload {
	case "hawk":
		return nil
	case "idless":
	default:
		return fmt.Errorf("-workload %q: want hawk or idless", o.workload)
	}
	// Its thresholds follow from the events per group, no group is new,
	// and -scale is the other workload's.
	for _, name := range []string{"threshold", "new", "scale"} {
		if set[name] {
			return fmt.Errorf("-%s does not apply with -workload idless", name)
		}
	}
	o.newFraction = 0
	for name, apply := range map[string]func(){
		"events":   func() { o.events = 200_000 },
		"projects": func() { o.projects = 100 },
		"rules":    func() { o.rules = 5 },
		"groups":   func() { o.groups = 5000 },
	} {
		if !set[name] {
			apply()
		}
	}
	return nil
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
