package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// The same checker through Redis faults: planned Sentinel failovers
// (SENTINEL FAILOVER) of a deployment of the test's own while workers are
// also killed, with KLAXON_REDIS_WAIT_REPLICAS=1 [KLAXON_TEST_CHAOS_WAIT]:
// every firing notified once, none twice but for the kills' repeats.
// KLAXON_TEST_CHAOS_EVENTS [6000, at 300/s] sizes the run.
//
//	KLAXON_TEST_SENTINEL=1 KLAXON_TEST_CHAOS_EVENTS=20000 KLAXON_TEST_CHAOS_WAIT=0 go test -run TestChaosSentinelFailovers -v ./tools/chaos
func TestChaosSentinelFailovers(t *testing.T) {
	testenv.SentinelPhase(t)
	s := testenv.StartSentinel(t)
	wait := envInt(t, "KLAXON_TEST_CHAOS_WAIT", 1)
	res := runFaults(t, Config{Fault: FaultFailover, RedisURL: s.URL(), WaitReplicas: wait,
		FaultEvery: time.Second, KillEvery: time.Second})
	t.Logf("%d planned failovers; the sentinels changed the master %d times", res.Faults, res.MasterChanges)
	if res.MasterChanges < res.Faults {
		t.Errorf("the sentinels announced %d master changes for %d planned failovers: the watch missed some", res.MasterChanges, res.Faults)
	}
	if wait > 0 && !res.OK() {
		t.Errorf("with WAIT for %d replica: the run is not OK (%d missed, %d extra, %d repeats of which %d after a kill)",
			wait, res.Missed, res.Extra, res.Repeats, res.RepeatsAfterKill)
	}
	// A planned failover takes 10-20 s here: the sentinels turn the old
	// master into a replica at their next look at it, every 10 s.
	if res.Faults < 1 {
		t.Errorf("a weak run: %d failovers", res.Faults)
	}
}

// Redis Cluster slots moved (redis-cli --cluster reshard, 1000 slots
// between random masters of a cluster of the test's own) while workers
// count and are killed: every firing notified once.
//
//	KLAXON_TEST_RESHARD=1 KLAXON_TEST_CHAOS_EVENTS=20000 go test -run TestChaosReshard -v ./tools/chaos
func TestChaosReshard(t *testing.T) {
	testenv.ReshardPhase(t)
	c := testenv.StartCluster(t)
	res := runFaults(t, Config{Fault: FaultReshard, RedisURL: "redis+cluster://" + strings.Join(c.Addrs, ","),
		ReshardSlots: 1000, FaultEvery: 200 * time.Millisecond, KillEvery: time.Second})
	if !res.OK() {
		t.Errorf("the run is not OK (%d missed, %d extra, %d repeats of which %d after a kill)",
			res.Missed, res.Extra, res.Repeats, res.RepeatsAfterKill)
	}
	if res.Faults < 3 {
		t.Errorf("a weak run: %d reshards", res.Faults)
	}
}

// runFaults runs the chaos run cfg describes, with the rest of its
// settings as the crash test's, and logs its table.
func runFaults(t *testing.T, cfg Config) *Result {
	cfg.Worker = buildWorker(t)
	cfg.Workers = 3
	cfg.Events = envInt(t, "KLAXON_TEST_CHAOS_EVENTS", 6000)
	cfg.Groups = max(150, cfg.Events/40)
	cfg.Rate = 300
	cfg.BatchesInFlight = envInt(t, "KLAXON_TEST_CHAOS_FLIGHT", 0)
	cfg.BatchLinger = os.Getenv("KLAXON_TEST_CHAOS_LINGER")
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Timeout = time.Duration(cfg.Events/cfg.Rate)*time.Second + 3*time.Minute
	cfg.AMQPURL = testenv.AMQPURL(t)
	cfg.Dir = t.TempDir()
	if dir := os.Getenv("KLAXON_TEST_CHAOS_DIR"); dir != "" {
		// Kept, with the workers' debug lines (every event counted, with
		// its id and what it fired), to trace a finding.
		cfg.Dir, cfg.Keep, cfg.LogLevel = dir, true, "debug"
	}
	cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	res, err := Run(context.Background(), cfg)
	if err != nil {
		dumpLogs(t, cfg.Dir)
		t.Fatal(err)
	}
	var table bytes.Buffer
	printTable(&table, res)
	t.Logf("-fault %s -wait-replicas %d, seed %d:\n%s", cfg.Fault, cfg.WaitReplicas, cfg.Seed, table.String())
	if res.Unsettled != "" || len(res.UnexpectedExits) > 0 || res.Bad != 0 {
		t.Errorf("unsettled %q, unexpected exits %v, %d bad bodies", res.Unsettled, res.UnexpectedExits, res.Bad)
	}
	if res.LogChecked == 0 || res.Unlogged != 0 {
		t.Errorf("%d of %d sends by workers never killed have no line the checker can read", res.Unlogged, res.LogChecked)
	}
	if !res.OK() && !cfg.Keep {
		dumpLogs(t, cfg.Dir)
	}
	return res
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}
