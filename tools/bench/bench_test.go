package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// The broker is the matching process that listens on the bench's port,
// else the one that started first, not the one with the lowest pid: pids
// wrap, and RabbitMQ's command-line tools are beam.smp processes too.
func TestFindProcessTakesTheListenerThenTheOldest(t *testing.T) {
	proc := t.TempDir()
	add := func(pid int, comm, cmdline string, start int) {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		// Every field procfs reads: starttime is the 22nd.
		stat := fmt.Sprintf("%d (%s) S 1 1 1 0 -1 4194560 1 0 0 0 7 3 0 0 20 0 30 0 %d 1000 10 18446744073709551615 1 1 1 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n", pid, comm, start)
		for name, body := range map[string]string{"comm": comm + "\n", "cmdline": cmdline, "stat": stat} {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(2964, "beam.smp", "beam.smp\x00-s\x00rabbit\x00boot", 500)
	add(679, "beam.smp", "beam.smp\x00-s\x00rabbitmqctl_escript", 90000) // a tool, after pids wrapped
	add(12, "beam.smp", "beam.smp\x00-s\x00other_app", 100)              // no "rabbit"
	add(13, "redis-server", "redis-server\x00rabbit", 50)                // another name
	if got := findProcess(proc, "beam.smp", "rabbit", 0); got != 2964 {
		t.Errorf("findProcess = %d, want 2964, the broker that started first", got)
	}
	if got := findProcess(proc, "nginx", "", 0); got != 0 {
		t.Errorf("no such process: %d, want 0", got)
	}

	// A second node, started later, listens on 5673 (0x1629): the bench
	// talking to it meters it, not the older one.
	add(3100, "beam.smp", "beam.smp\x00-s\x00rabbit\x00boot", 900)
	if err := os.MkdirAll(filepath.Join(proc, "3100", "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("socket:[4242]", filepath.Join(proc, "3100", "fd", "7")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(proc, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	tcp := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 0100007F:1629 00000000:0000 0A 00000000:00000000 00:00000000 00000000   107        0 4242 1 0000000000000000 100 0 0 10 0\n" +
		"   1: 0100007F:1629 0100007F:B0C2 01 00000000:00000000 00:00000000 00000000   107        0 4343 1 0000000000000000 20 4 30 10 -1\n"
	if err := os.WriteFile(filepath.Join(proc, "net", "tcp"), []byte(tcp), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := findProcess(proc, "beam.smp", "rabbit", 5673); got != 3100 {
		t.Errorf("findProcess on port 5673 = %d, want 3100, the node listening there", got)
	}
	if got := findProcess(proc, "beam.smp", "rabbit", 5672); got != 2964 {
		t.Errorf("findProcess on port 5672, where nothing listens = %d, want 2964, the oldest", got)
	}
	if got := amqpPort("amqp://guest:guest@127.0.0.1:5673/"); got != 5673 {
		t.Errorf("amqpPort = %d, want 5673", got)
	}
	if got := amqpPort("amqp://localhost/"); got != 5672 {
		t.Errorf("amqpPort without a port = %d, want 5672", got)
	}
}

func TestBusySince(t *testing.T) {
	before := hostTime{busy: 170, total: 990}
	if b := (hostTime{busy: 260, total: 1090}).busySince(before); b != 0.9 {
		t.Errorf("busy since: %v, want 0.9", b)
	}
	if b := before.busySince(before); b != 0 {
		t.Errorf("no time between: %v, want 0", b)
	}
	// Sums of float seconds: all busy may come out a hair over 1
	// ((0.1+0.2-0.1)/(0.3-0.1) in float64).
	tenth, fifth := 0.1, 0.2
	if b := (hostTime{busy: tenth + fifth, total: 0.3}).busySince(hostTime{busy: tenth, total: tenth}); b != 1 {
		t.Errorf("all busy: %v, want 1", b)
	}
	now, err := hostCPU()
	if err != nil || now.total <= 0 || now.busy <= 0 || now.busy > now.total {
		t.Errorf("this host's cpu: %+v, %v", now, err)
	}
}

// loadWhile tells the CPU a span cost each process apart: this test spins
// until it has used 200 ms of CPU, however busy the machine, twice, and
// each span counts its own spin only; a gone process counts nothing.
func TestLoadWhile(t *testing.T) {
	const want = 200 * time.Millisecond
	for range 2 {
		var spun time.Duration
		spin := func() error {
			start, err := processCPU(os.Getpid())
			for deadline := time.Now().Add(20 * time.Second); err == nil; {
				var now time.Duration
				now, err = processCPU(os.Getpid())
				if spun = now - start; spun >= want {
					return err
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("spun 20 s for %v of CPU, got %v", want, spun)
				}
			}
			return err
		}
		l, err := loadWhile(cpuSet{"self": {os.Getpid()}, "gone": {1 << 30}}, spin)
		if err != nil {
			t.Fatal(err)
		}
		c := l.cores()
		if got := l.cpu["self"]; got < spun || got > spun+100*time.Millisecond || c["self"] <= 0 || c["self"] > float64(runtime.NumCPU()) ||
			c["gone"] != 0 || l.busy <= 0 || l.busy > 1 {
			t.Errorf("cpu %v, cores %v, host busy %v over %v: want this test's %v of spinning", l.cpu, c, l.busy, l.elapsed, spun)
		}
	}
}

func TestProcessCPUOfSelf(t *testing.T) {
	if cpu, err := processCPU(os.Getpid()); err != nil || cpu <= 0 {
		t.Errorf("this process' cpu: %v, %v", cpu, err)
	}
	if rss, err := peakRSS(os.Getpid()); err != nil || rss <= 0 {
		t.Errorf("this process' peak RSS: %v, %v", rss, err)
	}
	if !isProcess(os.Getpid(), "bench") {
		t.Error("this process is not found by its name")
	}
	if _, err := processCPU(1 << 30); err == nil {
		t.Error("no error for a pid that does not exist")
	}
	if isProcess(0, "x") {
		t.Error("pid 0 is a process")
	}
}

func TestPercentile(t *testing.T) {
	var ms []time.Duration
	for i := 1; i <= 100; i++ {
		ms = append(ms, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50, 95: 95, 99: 99, 100: 100, 0.1: 1} {
		if got := percentile(ms, p); got != want*time.Millisecond {
			t.Errorf("p%v = %v, want %v", p, got, want*time.Millisecond)
		}
	}
	if got := percentile(ms[:1], 99); got != time.Millisecond {
		t.Errorf("p99 of one value = %v", got)
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %v", got)
	}
	var l Latency
	l.summarize([]time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond},
		[]time.Duration{time.Millisecond, 0, time.Millisecond, 3 * time.Millisecond})
	if l.Received != 4 || l.P50 != 2 || l.P95 != 4 || l.Max != 4 || l.FiredP50 != 1 || l.FiredP99 != 3 {
		t.Errorf("summary %+v", l)
	}
}

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.6: "1,234,568", -12345: "-12,345"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestWriteMarkdown(t *testing.T) {
	var b bytes.Buffer
	writeMarkdown(&b, [][]string{{"system", "events/s"}, {"bare", "21,000"}, {"Klaxon, 1 worker", "9"}})
	want := "" +
		"| system           | events/s |\n" +
		"|------------------|---------:|\n" +
		"| bare             |   21,000 |\n" +
		"| Klaxon, 1 worker |        9 |\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestWriteTable(t *testing.T) {
	rep := &Report{
		Settings: Settings{Events: 1000, Projects: 2, Rules: 4, Groups: 10, Threshold: 100, Seed: 1},
		Host:     Host{Cores: 2, LoadStart: [3]float64{0.5}, LoadEnd: [3]float64{0.75}, Redis: "7.0", RabbitMQ: "3.10", Go: "go1.26"},
		Results: []Result{
			{System: "ceiling", EventsPerSec: 20000, CeilingRatio: 1},
			{System: "klaxon", Workers: 2, Events: 1000, EventsPerSec: 16500, CeilingRatio: 0.83, WorkerRSS: 32 << 20,
				PerEvent: PerEvent{RoundTrips: 0.02, Commands: 4.25, Scripts: 0.44, WorkerCPU: 20, RedisCPU: 30, BrokerCPU: 25},
				Redis:    redisDelta{Calls: map[string]int64{"evalsha": 440, "get": 1200}, Scripts: 440, ScriptMicros: 44000, ScriptCommandMicros: 4000},
				Latency: &Latency{Rate: 8250, Probes: 10, Received: 9, P50: 12.5, P95: 30, P99: 41.25, FiredP50: 4, FiredP99: 19, HostBusy: 0.914, WorkerCPU: 118.4, Deferred: 3,
					Cores: map[string]float64{"broker": 1.024, "bench": 0.37, "worker": 0.535, "redis": 0.161}}},
			{System: "ceiling", Queues: 4, EventsPerSec: 40000, CeilingRatio: 1},
		},
		Memory: &Memory{Workers: 1, Events: 1000, Groups: 10, UsedDelta: 3 << 20, Keys: 50, PerKey: 62914.56,
			Stats: keyStats{States: 40, Pages: 10, StateBytes: 456, InlineBytes: 80, PageBytes: 1100}, DedupPerEvt: 14.2},
	}
	var b bytes.Buffer
	writeTable(&b, rep)
	out := b.String()
	for _, want := range []string{
		"1,000 events, 2 projects × 4 rules, 10 groups (0% new)", "load average 0.50 at start, 0.75 at end",
		"| bare consumer (ack only) ", "| Klaxon, 2 workers", "| bare consumer (ack only), 4 queues |", "16,500", "83%", "0.020", "4.25", "32 MiB",
		"12.5 / 30.0 / 41.2 at 8,250/s, host 91% busy (broker 1.02, bench 0.37, worker 0.54, Redis 0.16 CPUs), worker 118 µs/ev (9 of 10 probes), 3 notifications put back for their turn; to the firing p50 / p99 4 / 19",
		"evalsha=440", "get=1200", "100.0 µs per call, 44.0 µs per event; of which 4.0 µs per event in the commands they call, 40.0 µs in Lua",
		"used_memory +3.0 MiB in 50 keys", "40 group state keys, MEMORY USAGE 456 B each, of which 80 B are ids; 10 pages of ids, 1100 B each; ids: 14.2 B per event",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestParseInfoAndDiff(t *testing.T) {
	before := parseInfo("# Server\r\nredis_version:7.0.15\r\nprocess_id:2221\r\n# Stats\r\ntotal_writes_processed:100\r\n" +
		"# Memory\r\nused_memory:1000\r\n# Commandstats\r\ncmdstat_get:calls=10,usec=20,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=5,usec=500,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n")
	if before.version != "7.0.15" || before.processID != 2221 || before.writes != 100 || before.usedMemory != 1000 || before.calls["get"] != 10 {
		t.Fatalf("parsed %+v", before)
	}
	after := parseInfo("total_writes_processed:131\r\ncmdstat_get:calls=30,usec=60\r\ncmdstat_evalsha:calls=10,usec=1000\r\n" +
		"cmdstat_info:calls=6,usec=600\r\ncmdstat_ping:calls=1,usec=1\r\ncmdstat_set:calls=1,usec=40\r\n")
	d := diffInfo(before, after)
	if d.RoundTrips != 30 || d.Commands != 32 || d.Scripts != 10 || d.Calls["info"] != 0 || d.Calls["get"] != 20 {
		t.Errorf("delta %+v", d)
	}
	// GET is sent outside scripts: it is not counted as the scripts' commands.
	if d.ScriptMicros != 1000 || d.ScriptCommandMicros != 40 || d.DirectMicros != 40 {
		t.Errorf("script µs %d, of which commands %d, direct %d; want 1000, 40 and 40", d.ScriptMicros, d.ScriptCommandMicros, d.DirectMicros)
	}
	if got := d.topCalls(2); got != "get=20 evalsha=10" {
		t.Errorf("topCalls = %q", got)
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP klaxon_events_total Incoming events by outcome.
# TYPE klaxon_events_total counter
klaxon_events_total{outcome="counted"} 1500
klaxon_events_total{outcome="unmatched"} 20
klaxon_events_total{outcome="dead"} 60
klaxon_batches_total{outcome="ok",stage="evaluator"} 7
klaxon_batches_total{outcome="ok",stage="deliverer"} 3
klaxon_notifications_total{channel="webhook",outcome="sent"} 40
klaxon_notifications_total{channel="webhook",outcome="deferred"} 4
klaxon_notifications_total{channel="telegram",outcome="throttled"} 2
klaxon_events_totalx 9
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	// Dead-lettered events are events too.
	if m["events"] != 1580 || m["dead"] != 60 || m["batches"] != 7 || m["deferred"] != 6 {
		t.Errorf("metrics %v", m)
	}
	if _, err := parseMetrics(strings.NewReader(`klaxon_events_total{outcome="x"} nope`)); err == nil {
		t.Error("a bad value parsed")
	}
}

func TestRenderBar(t *testing.T) {
	got := renderBar("fill", 25, 100, 2*time.Second, 10)
	for _, want := range []string{"fill", "[##........]", " 25%", "25/100", "13/s", "2.0s"} {
		if !strings.Contains(got, want) {
			t.Errorf("bar %q lacks %q", got, want)
		}
	}
	if got := renderBar("x", 150, 100, time.Second, 4); !strings.Contains(got, "[####] 100%") {
		t.Errorf("overfull bar %q", got)
	}
	var b bytes.Buffer
	p := newProgress(&b, "lines")
	p.phase("one", 10).Store(10)
	p.phase("two", 0).Store(3)
	p.end()
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "two") {
		t.Errorf("progress lines %q", b.String())
	}
}

func TestWorkload(t *testing.T) {
	o := defaultOptions()
	o.events, o.projects, o.groups, o.rules = 500, 3, 40, 5
	w := newWorkload(o)
	if again := newWorkload(o); string(again.body(0, 7)) != string(w.body(0, 7)) {
		t.Error("the same seed generated other events")
	}
	seen := map[int]int{}
	for i, g := range w.order {
		seen[g]++
		if w.isNew[i] != (seen[g] == 1) {
			t.Fatalf("event %d: isNew %v but it is the group's event #%d", i, w.isNew[i], seen[g])
		}
	}
	if len(seen) != o.groups || len(w.order) != o.events {
		t.Errorf("%d groups in %d events, want %d in %d", len(seen), len(w.order), o.groups, o.events)
	}
	yml, err := w.rulesYAML("http://127.0.0.1:1/hook")
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/rules.yaml"
	if err := os.WriteFile(path, yml, 0o600); err != nil {
		t.Fatal(err)
	}
	specs, err := store.NewFileSource(path).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	snap := store.Compile(specs, time.Now())
	if snap.Skipped() != 0 || snap.Projects() != o.projects+1 || snap.Len() != o.projects*o.rules+1 {
		t.Fatalf("rules: %d projects, %d rules, problems %v", snap.Projects(), snap.Len(), snap.Problems())
	}
	for round := range 2 {
		for i := range o.events {
			m, err := event.Decode(w.body(round, i))
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			if len(snap.Rules(m.ProjectID)) != o.rules || (round > 0 && m.Event.IsNew) {
				t.Fatalf("event %d of round %d: %+v", i, round, m)
			}
		}
	}
	m, err := event.Decode(w.probeBody("run", 3))
	if err != nil || !m.Event.IsNew || len(snap.Rules(m.ProjectID)) != 1 {
		t.Fatalf("probe %+v: %v", m, err)
	}
	if run, n, ok := parseProbeID(*m.Event.RepetitionID); !ok || run != "run" || n != 3 {
		t.Errorf("probe id %q parsed as %q %d %v", *m.Event.RepetitionID, run, n, ok)
	}
	for _, bad := range []string{"", "probe-", "probe-x", "x-1", "probe-a-b"} {
		if _, _, ok := parseProbeID(bad); ok {
			t.Errorf("parseProbeID(%q) succeeded", bad)
		}
	}
}

func TestIdlessWorkload(t *testing.T) {
	o, err := parseFlags([]string{"-workload", "idless", "-groups", "1000", "-events", "40000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.projects != 100 || o.rules != 5 || o.groups != 1000 || o.events != 40000 || o.newFraction != 0 {
		t.Fatalf("-workload idless gave %+v", o)
	}
	w := newWorkload(o)
	perGroup := map[int]int{}
	for i := range o.events {
		body := w.body(0, i)
		if string(body) != string(w.body(1, i)) {
			t.Fatalf("event %d differs between rounds: an idless message has nothing to tell them apart", i)
		}
		var raw struct{ Event map[string]any }
		if err := json.Unmarshal(body, &raw); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		for _, absent := range []string{"repetitionId", "timestamp", "isNew"} {
			if _, ok := raw.Event[absent]; ok {
				t.Fatalf("event %d has %s: %s", i, absent, body)
			}
		}
		m, err := event.Decode(body)
		if err != nil || m.Event.RepetitionID != nil || m.Event.GroupHash != w.groupHash(i) {
			t.Fatalf("event %d %s: %+v, %v", i, body, m, err)
		}
		perGroup[w.order[i]]++
	}
	// One group in a hundred four times as busy: ten groups of about 4 ×
	// 40000/1030 = 155 events, the others about 39.
	busy := 0
	for _, n := range perGroup {
		if n > 100 {
			busy++
		}
	}
	if busy != 10 {
		t.Errorf("%d busy groups, want 10: %v", busy, perGroup)
	}
	msg := (&bench{queue: "q"}).message(w.groupHash(0), w.body(0, 0))
	if msg.MessageID != "" {
		t.Errorf("message has id %q", msg.MessageID)
	}
	specs := w.ruleSpecs("http://127.0.0.1:1/hook")
	var got []string
	for _, s := range specs {
		got = append(got, fmt.Sprintf("%s %d/%d", s.WhatToReceive, s.Threshold, s.ThresholdPeriod))
	}
	want := "SEEN_MORE 60/3600000 SEEN_MORE 80/86400000 SEEN_MORE 100/3600000 SEEN_MORE 120/86400000 SEEN_MORE 140/3600000"
	if strings.Join(got, " ") != want {
		t.Errorf("rules %s, want %s", strings.Join(got, " "), want)
	}
	for _, args := range [][]string{{"-workload", "idless", "-threshold", "5"}, {"-workload", "idless", "-new", "0.5"},
		{"-workload", "idless", "-scale"}, {"-workload", "nohawk"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) succeeded", args)
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-scale", "-events", "5000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.projects != 1000 || o.rules != 10 || o.groups != 100_000 || o.events != 5000 || len(o.workers) != 1 || o.newFraction != 0.1 ||
		strings.Join(o.systems, ",") != "ceiling,klaxon" {
		t.Errorf("-scale gave %+v", o)
	}
	o, err = parseFlags([]string{"-workers", "3,1", "-systems", "klaxon,ceiling", "-env", "KLAXON_BATCH_SIZE=512"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.workers[0] != 3 || strings.Join(o.systems, ",") != "ceiling,klaxon" || o.workerEnv["KLAXON_BATCH_SIZE"] != "512" {
		t.Errorf("got %+v", o)
	}
	if o.queueType != queue.Classic {
		t.Errorf("events queue type %q without KLAXON_QUEUE_TYPE, want classic as the workers'", o.queueType)
	}
	// The bench makes the events queue: of the type the workers would make.
	if o, err = parseFlags([]string{"-env", "KLAXON_QUEUE_TYPE=quorum"}, io.Discard); err != nil || o.queueType != queue.Quorum {
		t.Errorf("-env KLAXON_QUEUE_TYPE=quorum: queue type %q, %v", o.queueType, err)
	}
	if o, err = parseFlags([]string{"-queue-mode", "lazy"}, io.Discard); err != nil || o.queueMode != "lazy" {
		t.Errorf("-queue-mode lazy: %q, %v", o.queueMode, err)
	}
	if o.latencyPublish != "persistent" {
		t.Errorf("latency published %q by default, want persistent", o.latencyPublish)
	}
	if o, err = parseFlags([]string{"-latency-publish", "hawk"}, io.Discard); err != nil || o.latencyPublish != "hawk" {
		t.Errorf("-latency-publish hawk: %q, %v", o.latencyPublish, err)
	}
	for _, args := range [][]string{{"-queue-mode", "fast"}, {"-queue-mode", "lazy", "-env", "KLAXON_QUEUE_TYPE=quorum"}, {"-latency-publish", "transient"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	if o, err = parseFlags([]string{"-queues", "1,2,4"}, io.Discard); err != nil || !slices.Equal(o.queues, []int{1, 2, 4}) {
		t.Errorf("-queues 1,2,4: %v, %v", o.queues, err)
	}
	for _, args := range [][]string{{"-queues", "0"}, {"-queues", "300"}, {"-workers", "0"}, {"-systems", "nats"}, {"-env", "PATH=/x"}, {"-events", "0"}, {"-env", "KLAXON_QUEUE_TYPE=stream"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) succeeded", args)
		}
	}
}

func TestParseFlagsBigMessages(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil || o.bigMessages != 0 {
		t.Fatalf("without -big-messages: %d big messages, %v; want the throughput run", o.bigMessages, err)
	}
	o, err = parseFlags([]string{"-big-messages", "60"}, io.Discard)
	if err != nil || o.bigMessages != 60 || o.bigMiB != 10 || o.bigTimeout != 5*time.Minute {
		t.Errorf("-big-messages 60: %d × %d MiB within %s, %v; want 60 × 10 MiB within 5m", o.bigMessages, o.bigMiB, o.bigTimeout, err)
	}
	o, err = parseFlags([]string{"-big-messages", "10", "-big-mib", "2", "-big-timeout", "1m", "-worker", "/bin/k",
		"-env", "KLAXON_MAX_HELD_BYTES=16GiB,GOMEMLIMIT=200MiB", "-amqp", "amqp://x/", "-redis", "redis://x/1", "-progress", "off"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.bigMessages != 10 || o.bigMiB != 2 || o.bigTimeout != time.Minute || o.workerBin != "/bin/k" || o.amqpURL != "amqp://x/" ||
		o.workerEnv["KLAXON_MAX_HELD_BYTES"] != "16GiB" || o.workerEnv["GOMEMLIMIT"] != "200MiB" {
		t.Errorf("got %+v", o)
	}
	if got := envString(o.workerEnv); got != "GOMEMLIMIT=200MiB,KLAXON_MAX_HELD_BYTES=16GiB" {
		t.Errorf("env in the result line %q", got)
	}
	for _, args := range [][]string{
		{"-big-messages", "0"}, {"-big-messages", "-1"}, {"-big-messages", "5", "-big-mib", "0"},
		{"-big-messages", "5", "-big-timeout", "0s"}, {"-big-mib", "5"}, {"-big-timeout", "1m"},
		// Flags of the throughput run would be ignored: refused instead.
		{"-big-messages", "5", "-events", "100"}, {"-big-messages", "5", "-scale"}, {"-big-messages", "5", "-json"},
		{"-big-messages", "5", "-env", "PATH=/x"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) succeeded", args)
		}
	}
}

// TestRunEndToEnd runs the whole tool with tiny settings against the real
// services and the real worker binary. It checks behaviour only: every
// system consumed every event, the probes came back, the JSON has its
// fields, and nothing is left behind. Never timings.
func TestRunEndToEnd(t *testing.T) {
	o := defaultOptions()
	o.amqpURL, o.redisURL = testenv.AMQPURL(t), testenv.RedisURL()
	o.events, o.projects, o.rules, o.groups, o.threshold = 2000, 5, 4, 50, 20
	o.workers = []int{1}
	o.queues = []int{1, 2}
	o.latency, o.probeRate = time.Second, 20
	o.progress = "off"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := run(ctx, o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var systems []string
	for _, r := range rep.Results {
		systems = append(systems, fmt.Sprintf("%s×%d", r.System, r.Queues))
		if r.Consumed != o.events || r.Events < 1 || r.Events > o.events || r.EventsPerSec <= 0 || r.CeilingRatio <= 0 {
			t.Errorf("%s: %+v", r.System, r)
		}
	}
	// The bare consumer times every message of its latency phase, on one
	// queue and on the hashed ones.
	for _, i := range []int{0, 3} {
		if l := rep.Results[i].Latency; l == nil || l.Events == 0 || l.Received != l.Events || l.P99 <= 0 || l.HostBusy <= 0 || l.HostBusy > 1 || l.Cores["broker"] <= 0 || l.Cores["bench"] <= 0 {
			t.Errorf("the floor's latency on %d queue(s): %+v", rep.Results[i].Queues, l)
		}
	}
	// Hawk's notifier reads one queue: it runs with one only.
	if strings.Join(systems, ",") != "ceiling×1,hawk×1,klaxon×1,ceiling×2,klaxon×2" {
		t.Fatalf("systems %v", systems)
	}
	// The probes went through the exchange too: each came back.
	if hashed := rep.Results[4]; hashed.Latency == nil || hashed.Latency.Probes == 0 || hashed.Latency.Received != hashed.Latency.Probes {
		t.Errorf("Klaxon on 2 hashed queues: %+v", hashed)
	}
	hawk, klaxon := rep.Results[1], rep.Results[2]
	if hawk.Redis.Scripts == 0 || klaxon.Redis.Scripts == 0 || klaxon.Notifications == 0 {
		t.Errorf("Hawk ran %d scripts, Klaxon %d and sent %d notifications", hawk.Redis.Scripts, klaxon.Redis.Scripts, klaxon.Notifications)
	}
	if l := klaxon.Latency; l == nil || l.Probes == 0 || l.Received != l.Probes || l.HostBusy <= 0 || l.HostBusy > 1 || l.WorkerCPU <= 0 || l.Cores["worker"] <= 0 || l.Cores["redis"] <= 0 {
		t.Errorf("latency %+v: every probe should notify", l)
	}
	if m := rep.Memory; m == nil || m.Stats.States == 0 || m.Stats.InlineBytes == 0 || m.DedupPerEvt == 0 {
		t.Errorf("memory %+v", m)
	}

	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	results, _ := doc["results"].([]any)
	if len(results) != 5 || doc["settings"] == nil || doc["host"] == nil || doc["redisMemory"] == nil {
		t.Fatalf("JSON %s", b)
	}
	last, _ := results[2].(map[string]any)
	for _, field := range []string{"system", "workers", "queues", "events", "eventsPerSecond", "ceilingRatio", "perEvent", "redis", "workerPeakRssBytes", "latency"} {
		if _, ok := last[field]; !ok {
			t.Errorf("Klaxon's JSON result lacks %q: %v", field, last)
		}
	}
	perEvent, _ := last["perEvent"].(map[string]any)
	for _, field := range []string{"redisRoundTrips", "redisCommands", "workerCpuMicros", "redisCpuMicros", "brokerCpuMicros"} {
		if _, ok := perEvent[field]; !ok {
			t.Errorf("perEvent lacks %q", field)
		}
	}

	// Nothing left behind: no key, no queue of the run.
	rdb := redis.NewClient(mustParseRedisURL(t, o.redisURL))
	defer rdb.Close()
	if keys, err := rdb.Keys(ctx, rep.Settings.Prefix+"*").Result(); err != nil || len(keys) > 0 {
		t.Errorf("keys left: %d (%v)", len(keys), err)
	}
	conn, err := amqp.Dial(o.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{rep.Settings.Prefix + ".events", rep.Settings.Prefix + "-k1.deliveries",
		rep.Settings.Prefix + ".events.1", rep.Settings.Prefix + "-k1-q2.deliveries"} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err == nil {
			t.Errorf("queue %s left behind", q)
			_ = ch.Close()
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclarePassive(rep.Settings.Prefix+".events.hash", "x-consistent-hash", true, false, false, false, nil); err == nil {
		t.Error("exchange left behind")
	}
}

func mustParseRedisURL(t *testing.T, url string) *redis.Options {
	t.Helper()
	o, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// -queue-mode lazy makes the hashed queues lazy as the bench declares
// them: declared again without the argument, the broker refuses them for
// it, and with it, takes them.
func TestLayoutMakesTheQueuesOfTheQueueMode(t *testing.T) {
	url := testenv.AMQPURL(t)
	br := testBroker(t, url)
	name := testenv.QueueName(t)
	b := &bench{o: options{queueMode: "lazy"}, br: br, queue: name}
	testenv.DeleteQueuesAtCleanup(t, wire.HashedQueue(name, 0), wire.HashedQueue(name, 1))
	t.Cleanup(func() { _ = br.deleteExchanges(wire.HashExchange(name)) })
	if err := b.layout(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	redeclare := func(q string, args amqp.Table) error {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		_, err = ch.QueueDeclare(q, true, false, false, false, args)
		return err
	}
	for _, q := range b.incoming {
		var aerr *amqp.Error
		if err := redeclare(q, nil); !errors.As(err, &aerr) || aerr.Code != amqp.PreconditionFailed || !strings.Contains(aerr.Reason, "x-queue-mode") {
			t.Errorf("%s declared again without x-queue-mode: %v, want PRECONDITION_FAILED naming it", q, err)
		}
		if err := redeclare(q, amqp.Table{"x-queue-mode": "lazy"}); err != nil {
			t.Errorf("%s declared again lazy: %v", q, err)
		}
	}
}

// The paced publisher sends persistent messages under confirms, or, with
// -latency-publish hawk, transient ones as Hawk's workers do; every one of
// them reaches the queue either way.
func TestPacerPublishesAsAsked(t *testing.T) {
	br := testBroker(t, testenv.AMQPURL(t))
	ctx := context.Background()
	for _, c := range []struct {
		transient bool
		want      uint8
	}{{false, amqp.Persistent}, {true, amqp.Transient}} {
		name := testenv.QueueName(t) + strconv.FormatBool(c.transient)
		testenv.DeleteQueuesAtCleanup(t, name)
		if err := br.Declare(ctx, name, nil); err != nil {
			t.Fatal(err)
		}
		var sent atomic.Int64
		p := pacer{rate: 2000, total: 20, transient: c.transient}
		if err := p.run(ctx, br, func(i int) queue.Message {
			return queue.Message{RoutingKey: name, Body: []byte(strconv.Itoa(i))}
		}, &sent); err != nil {
			t.Fatal(err)
		}
		ch, err := br.Conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for got := 0; got < p.total; {
			d, ok, err := ch.Get(name, true)
			switch {
			case err != nil:
				t.Fatal(err)
			case !ok && time.Now().After(deadline):
				t.Fatalf("transient %t: %d of %d messages in the queue", c.transient, got, p.total)
			case !ok:
				time.Sleep(10 * time.Millisecond) // a poll's pace: the queue is read until full or the deadline
			case d.DeliveryMode != c.want:
				t.Fatalf("transient %t: delivery mode %d, want %d", c.transient, d.DeliveryMode, c.want)
			default:
				got++
			}
		}
		_ = ch.Close()
		if sent.Load() != int64(p.total) {
			t.Errorf("transient %t: %d counted as sent, want %d", c.transient, sent.Load(), p.total)
		}
	}
	// Without confirms, a publish the broker refuses still fails the run.
	var sent atomic.Int64
	p := pacer{rate: 2000, total: 1, transient: true} // one publish: its refusal comes after it
	if err := p.run(ctx, br, func(int) queue.Message {
		return queue.Message{Exchange: testenv.QueueName(t) + ".missing", RoutingKey: "x", Body: []byte("{}")}
	}, &sent); err == nil {
		t.Error("transient publishing to a missing exchange: no error")
	}
}

// testBroker is the bench's broker access on url, closed when t ends.
func testBroker(t *testing.T, url string) *broker {
	t.Helper()
	br, err := dialBroker(url, queue.Classic)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = br.Close() })
	return br
}
