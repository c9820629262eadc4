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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

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
	if o.workload != "hawk" {
		rep.Settings.Workload = o.workload
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
