// Command chaos checks docs/contract.md §4.5 under crashes: several worker processes
// consume one queue while it SIGKILLs and restarts them at random, and every
// firing must yield exactly one webhook notification. The only repeat
// allowed is a crash after the provider accepted a message but before
// Klaxon recorded it; those are counted, not failed.
//
// It writes a rules file, generates events whose firings do not depend on
// the order in which workers process them (checked with counter.Model in
// several orders), serves the webhook itself, runs the real worker binary,
// and compares the notification ids it receives with the model's:
//
//	go build -o /tmp/klaxon-worker ./cmd/worker
//	go run ./tools/chaos -worker /tmp/klaxon-worker -events 30000 -groups 500
//
// The exit status is 0 when nothing was missed, nothing extra arrived, no
// body was wrong and no worker exited by itself; 1 otherwise; 2 when the
// run could not be carried out. See docs/chaos.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

func main() {
	cfg := Config{Log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	var asJSON bool
	flag.StringVar(&cfg.Worker, "worker", "", "path of the worker binary (go build -o PATH ./cmd/worker); required")
	flag.IntVar(&cfg.Workers, "workers", 3, "worker processes on the queue")
	flag.IntVar(&cfg.Events, "events", 30000, "events to generate")
	flag.IntVar(&cfg.Groups, "groups", 500, "event groups to spread them over")
	flag.DurationVar(&cfg.KillEvery, "kill-every", 300*time.Millisecond, "mean interval between SIGKILLs (randomised, exponential); 0: no kills")
	flag.IntVar(&cfg.Rate, "rate", 1000, "events published per second (0: as fast as possible)")
	flag.Uint64Var(&cfg.Seed, "seed", uint64(time.Now().UnixNano()), "seed of the events and kill intervals")
	flag.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "limit of the whole run")
	flag.DurationVar(&cfg.Quiet, "quiet", 3*time.Second, "webhook silence, with every queue empty, that ends the run")
	flag.StringVar(&cfg.AMQPURL, "amqp", envOr("KLAXON_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&cfg.RedisURL, "redis", envOr("KLAXON_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL: single node, redis+sentinel:// or redis+cluster://")
	flag.StringVar(&cfg.Fault, "fault", "", "a Redis fault while events flow: failover (SENTINEL FAILOVER; -redis a redis+sentinel:// URL) or reshard (redis-cli --cluster reshard; -redis a redis+cluster:// URL)")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", 5*time.Second, "wait between one fault settling and the next")
	flag.IntVar(&cfg.ReshardSlots, "reshard-slots", 200, "slots each reshard moves")
	flag.IntVar(&cfg.WaitReplicas, "wait-replicas", 0, "the workers' KLAXON_REDIS_WAIT_REPLICAS")
	flag.IntVar(&cfg.BatchesInFlight, "batches-in-flight", 0, "the workers' KLAXON_BATCHES_IN_FLIGHT; 0 leaves their default")
	flag.StringVar(&cfg.BatchLinger, "batch-linger", "", "the workers' KLAXON_BATCH_LINGER (0: none); empty leaves their default")
	flag.StringVar(&cfg.LogLevel, "log-level", "info", "the workers' KLAXON_LOG_LEVEL (info or debug: the checker reads their \"notification sent\" lines)")
	flag.StringVar(&cfg.Dir, "dir", "", "directory for the rules file and worker logs (default: a temporary one, removed after a clean run)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the worker logs after a clean run")
	flag.BoolVar(&asJSON, "json", false, "print the result as JSON")
	flag.Parse()
	if asJSON {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
	} else {
		printTable(os.Stdout, res)
	}
	if !res.OK() {
		os.Exit(1)
	}
}

// printTable prints the result as a small table and what needs a word.
func printTable(w io.Writer, r *Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "events\tgroups kept\tworkers\tkills\texpected\treceived\tmissed\textra\trepeats\telapsed\t")
	fmt.Fprintf(tw, "%d\t%d/%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n", r.Events, r.GroupsKept, r.Groups, r.Workers,
		r.Kills, r.Expected, r.Received, r.Missed, r.Extra, r.Repeats, r.Elapsed.Round(100*time.Millisecond))
	tw.Flush()
	fmt.Fprintf(w, "seed %d; groups checked in %d orders, %d dropped as order-dependent; %d worker starts; "+
		"publish %s, chaos %s, settle %s\n", r.Seed, r.Orders, r.GroupsDropped, r.Starts,
		r.Publish.Round(100*time.Millisecond), r.Chaos.Round(100*time.Millisecond), r.Settle.Round(100*time.Millisecond))
	if r.Fault != "" {
		fmt.Fprintf(w, "Redis faults: %d × %s, workers waiting for %d replicas\n", r.Faults, r.Fault, r.WaitReplicas)
		if r.MasterChanges > r.Faults {
			fmt.Fprintf(w, "the sentinels changed the master %d times, %d of them by themselves: a master taken for dead right after a failover is a second failure, which one replica cannot cover\n",
				r.MasterChanges, r.MasterChanges-r.Faults)
		}
	}
	if r.InFlight > 0 {
		fmt.Fprintf(w, "workers with %d batches in flight\n", r.InFlight)
	}
	fmt.Fprintf(w, "repeats whose previous copy's sender was SIGKILLed before recording it: %d of %d\n", r.RepeatsAfterKill, r.Repeats)
	if r.RepeatsUnrecorded > 0 {
		fmt.Fprintf(w, "repeats whose previous copy's sender logged that Redis refused its record: %d\n", r.RepeatsUnrecorded)
	}
	fmt.Fprintf(w, "sends by workers never killed: %d, of which %d without their \"notification sent\" line in the sender's log\n",
		r.LogChecked, r.Unlogged)
	if len(r.UnloggedSample) > 0 {
		fmt.Fprintln(w, "unlogged (sample):", strings.Join(r.UnloggedSample, "; "))
	}
	for _, rp := range r.Repeated {
		var from string
		switch {
		case rp.Sender == gone:
			from = "a worker dead before the sink had looked it up"
		case rp.Sender == "":
			from = "an unknown worker"
		case rp.KilledAfter == "":
			from = rp.Sender + ", never killed"
		default:
			from = rp.Sender + ", killed " + rp.KilledAfter + " after the sink read it"
		}
		fmt.Fprintf(w, "  repeat %s: %d copies, first from %s; next copy %s later\n", rp.ID, rp.Copies, from, rp.Gap)
	}
	if r.Bad > 0 || r.Failed > 0 || r.Dead > 0 {
		fmt.Fprintf(w, "bad bodies %d, failed notifications %d, dead letters %d\n", r.Bad, r.Failed, r.Dead)
	}
	for _, e := range r.UnexpectedExits {
		fmt.Fprintln(w, "unexpected exit:", e)
	}
	if r.Unsettled != "" {
		fmt.Fprintln(w, "unsettled:", r.Unsettled)
	}
	if len(r.Missing) > 0 {
		fmt.Fprintln(w, "missed (sample):", strings.Join(r.Missing, "; "))
	}
	if len(r.Extras) > 0 {
		fmt.Fprintln(w, "extra (sample):", strings.Join(r.Extras, " "))
	}
	if r.LogDir != "" {
		fmt.Fprintln(w, "worker logs:", r.LogDir)
	}
	verdict := "OK: every firing notified, none twice except as listed"
	if !r.OK() {
		verdict = "FAILED"
	}
	fmt.Fprintln(w, verdict)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
