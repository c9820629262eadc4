// Command klaxon-worker is the Klaxon worker: it consumes Hawk's error events from
// RabbitMQ, counts them against each project's notification rules in Redis,
// and notifies by email, Telegram, Slack, Loop or webhook when a rule fires.
//
// The data path, in the order main wires it:
//
//	queue.Consumer (KLAXON_QUEUE, or its hashed queues)
//	  → evaluator: event.Decode → store.Cache rules → rules.Match (hawkdb: the
//	    group's marks and history) → livegroups (a full project's new groups
//	    counted as one) → counter.ObserveBatch
//	  → queue.Publisher: dead letters (<queue>.dead) and wire.Job delivery jobs
//	    (<prefix>.deliveries, a project's jobs past its share to .deliveries.bulk)
//	  → storm: storms of firings that want a "storm over" message,
//	    swept in Redis and ended with delivery jobs of their own
//	queue.Consumer (<prefix>.deliveries and .deliveries.bulk)
//	  → deliverer: budgets and circuits → claim → minPeriod gate and digest
//	    → pacing → a channel built by internal/channels → record, or retry later
//	    (with KLAXON_OUTPUT=hawk-senders the channel publishes Hawk's sender
//	    task to sender/<channel> instead: notify/hawksender)
//
// Every setting is an environment variable; see docs/configuration.md. The
// worker takes no arguments but --version and --help: anything else is an
// error before anything starts, so that a mistyped command never runs a
// worker with default settings against the real broker. The operators'
// tool is the other binary, klaxon (cmd/klaxon).
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/version"
)

func main() {
	if code, done := arguments(os.Args[1:], os.Stdout, os.Stderr); done {
		os.Exit(code)
	}
	cfg, err := config.Load(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "klaxon-worker:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	for _, u := range config.Unknown(os.Environ()) {
		log.Warn("unknown variable ignored", "variable", u.Name, "did_you_mean", u.Suggestion)
	}
	// go-redis logs through one package-level logger (its own lines on
	// stderr by default, 5-20 "failed to dial" a Sentinel failover), and
	// offers no per-client one: set it once, here, so that stderr stays
	// JSON lines. Tests that call run keep the library's default.
	redis.SetLogger(redisLogger{log.With("component", "go-redis")})
	if os.Getenv("GOGC") == "" {
		// A batch's garbage dies with it, and the live heap is tens of MB:
		// collecting at 4× it rather than Go's 2× halves the collector's
		// share of the worker's CPU for a few tens of MB more
		// (docs/benchmarks.md). GOGC and GOMEMLIMIT still win.
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMAXPROCS") == "" {
		// A worker counts one batch of a queue at a time: a processor
		// more than it has queues buys little, and where it shares a few
		// cores with the broker and Redis it costs hand-offs between
		// threads, a quarter to a half of the worker's CPU an event on two
		// cores (docs/benchmarks.md). GOMAXPROCS still wins.
		queues := len(cfg.IncomingQueues())
		if n := processors(queues, runtime.GOMAXPROCS(0)); n != runtime.GOMAXPROCS(0) {
			runtime.GOMAXPROCS(n)
			log.Info("Go processors set", "processors", n, "queues", queues)
		}
	}
	// Unless GOMEMLIMIT says otherwise, the collector works harder as the
	// heap nears 80% of the container's memory limit (its cgroup's), which
	// the 4× above would pass under 10 MB messages (docs/benchmarks.md).
	if limit, err := memlimit.Set(memlimit.WithRatio(0.8)); err != nil {
		log.Debug("no container memory limit read; GOMEMLIMIT left as it is", "err", err)
	} else if limit < math.MaxInt64 {
		log.Info("Go memory limit set", "bytes", limit)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, func() {
		// From the first signal on, a second one ends the process at once.
		stop()
		// Every stage bounds its own stop, but a dependency that stops
		// answering mid-close can still add up past the 10 s of docs/contract.md §7. What
		// is unfinished then is unacked: the broker hands it to another
		// worker, exactly as after a crash, which Klaxon is built to survive.
		time.AfterFunc(stopDeadline, func() {
			log.Error("klaxon did not stop in time; exiting with work unfinished", "deadline", stopDeadline.String())
			os.Exit(1)
		})
	})
	if err := run(ctx, cfg, log); err != nil {
		log.Error("klaxon stopped", "error", err)
		os.Exit(1)
	}
	log.Info("klaxon stopped")
}

const help = `klaxon-worker: the Klaxon worker. It consumes Hawk's events from RabbitMQ,
counts them against each project's rules in Redis and sends notifications.

Usage:
  klaxon-worker            run, configured by KLAXON_* environment variables
  klaxon-worker --version  print the version, commit and build time
  klaxon-worker --help     print this text

Every setting is an environment variable (docs/configuration.md); the
worker takes no other arguments. /metrics, /healthz and /readyz are served
on KLAXON_HTTP_ADDR [127.0.0.1:9464]. The operators' tool is "klaxon"
(rules check, test-send, failed list|show|replay, ...).
`

// arguments handles the worker's command line: --version and --help print
// and exit 0; any other argument is an error (exit 2) before anything
// starts. done is false when there are none and the worker should run.
func arguments(args []string, stdout, stderr io.Writer) (code int, done bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "--version", "-version", "version":
		if len(args) == 1 {
			fmt.Fprintln(stdout, "klaxon-worker", version.Read())
			return 0, true
		}
	case "--help", "-help", "-h", "help":
		if len(args) == 1 {
			fmt.Fprint(stdout, help)
			return 0, true
		}
	}
	fmt.Fprintf(stderr, "klaxon-worker: unexpected argument %q: the worker takes its settings from KLAXON_* variables only; run 'klaxon-worker --help'\n", strings.Join(args, " "))
	return 2, true
}
