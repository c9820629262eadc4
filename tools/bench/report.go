package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Report is everything one run measured; -json prints it as is.
type Report struct {
	Started  time.Time  `json:"started"`
	Settings Settings   `json:"settings"`
	Host     Host       `json:"host"`
	Results  []Result   `json:"results"`
	Memory   *Memory    `json:"redisMemory,omitempty"`
	Rules    *RulesLoad `json:"rulesLoad,omitempty"`
}

// RulesLoad is the cost of one load of the rules file, which the worker
// repeats every KLAXON_RULES_REFRESH; measured in the bench process.
type RulesLoad struct {
	Bytes      int64   `json:"fileBytes"`
	Rules      int     `json:"rules"`
	Millis     float64 `json:"ms"`
	AllocBytes int64   `json:"allocatedBytes"`
}

// Settings are the workload's parameters.
type Settings struct {
	Events    int     `json:"events"`
	Projects  int     `json:"projects"`
	Rules     int     `json:"rulesPerProject"`
	Groups    int     `json:"groups"`
	Threshold int64   `json:"threshold"`
	NewGroups float64 `json:"newGroupFraction"`
	Seed      int64   `json:"seed"`
	Workers   []int   `json:"workers"`
	Queues    []int   `json:"queues"`
	Latency   string  `json:"latencyDuration"`
	Prefix    string  `json:"prefix"`
	QueueMode string  `json:"queueMode,omitempty"` // -queue-mode
	// Workload is -workload when not Hawk's: "idless".
	Workload string `json:"workload,omitempty"`
	// LatencyPublish is how the latency phase published (-latency-publish).
	LatencyPublish string `json:"latencyPublish"`
}

// Host describes the machine and services.
type Host struct {
	Cores     int        `json:"cores"`
	LoadStart [3]float64 `json:"loadAverageStart"`
	LoadEnd   [3]float64 `json:"loadAverageEnd"`
	Redis     string     `json:"redisVersion"`
	RabbitMQ  string     `json:"rabbitmqVersion"`
	Go        string     `json:"goVersion"`
	RedisPID  int        `json:"redisPid"`
	BrokerPID int        `json:"brokerPid"`
}

// Result is one system's measurement.
type Result struct {
	System string `json:"system"` // ceiling, hawk, klaxon
	// Variant is "before" for the -before binary's result.
	Variant string `json:"variant,omitempty"`
	Workers int    `json:"workers,omitempty"`
	// Queues is how many incoming queues the events were spread over.
	Queues int `json:"queues"`
	// Events is how many events the rate is measured on (for Klaxon, those
	// consumed once every worker was up); Consumed is all of them.
	Events       int     `json:"events"`
	Consumed     int     `json:"consumed"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"eventsPerSecond"`
	CeilingRatio float64 `json:"ceilingRatio"`
	// Redis is what Redis did meanwhile; PerEvent divides it by Events.
	Redis    redisDelta `json:"redis"`
	PerEvent PerEvent   `json:"perEvent"`
	// WorkerRSS is the largest VmHWM of the worker processes, bytes.
	WorkerRSS     int64    `json:"workerPeakRssBytes,omitempty"`
	Notifications int64    `json:"notifications"`
	Batches       float64  `json:"batches,omitempty"`
	Latency       *Latency `json:"latency,omitempty"`
}

// PerEvent are costs per event.
type PerEvent struct {
	RoundTrips float64 `json:"redisRoundTrips"`
	Commands   float64 `json:"redisCommands"`
	Scripts    float64 `json:"redisScripts"`
	// CPU in µs per event: the consumer (Klaxon's workers, or the bench
	// process for the ceiling and Hawk), redis-server and RabbitMQ's beam.smp.
	WorkerCPU float64 `json:"workerCpuMicros"`
	RedisCPU  float64 `json:"redisCpuMicros"`
	BrokerCPU float64 `json:"brokerCpuMicros"`
}

// Latency is publish→webhook latency of probes published at a paced rate.
type Latency struct {
	Rate     float64 `json:"rate"` // events/s published, probes included
	Events   int     `json:"events"`
	Probes   int     `json:"probes"`
	Received int     `json:"received"`
	P50      float64 `json:"p50Ms"`
	P95      float64 `json:"p95Ms"`
	P99      float64 `json:"p99Ms"`
	Max      float64 `json:"maxMs"`
	// Fired: publish → the firing's firedAt, the clock Redis gave the
	// batch that counted the probe (ms, so ±1): the wait in the incoming
	// queue and the batch's start. The rest is counting, the delivery
	// queue and the send.
	FiredP50 float64 `json:"firedP50Ms"`
	FiredP99 float64 `json:"firedP99Ms"`
	// HostBusy is the share of the host's CPUs busy while the phase
	// published, every process counted (the broker, Redis, this bench):
	// a tail is read against how close the host was to full.
	HostBusy float64 `json:"hostBusy"`
	// WorkerCPU is the workers' CPU an event over the same span (µs), for
	// Klaxon: at a paced rate batches are small, and what each costs is
	// shared by fewer events than in a backlog.
	WorkerCPU float64 `json:"workerCpuMicros,omitempty"`
	// Deferred counts the notifications the workers put back to wait for
	// their turn during the phase (klaxon_notifications_total outcomes
	// deferred and throttled): a destination with every send it may have
	// in flight, or its provider's pace. Each waits 100 ms or more, so a
	// few explain a tail.
	Deferred int `json:"deferred,omitempty"`
	// Cores is how many CPUs each process kept busy on average over the
	// same span: broker, redis, bench (the publisher and webhook sink,
	// and the bare consumer for the floor) and, for Klaxon, worker.
	Cores map[string]float64 `json:"cores,omitempty"`
}

// coresText names the processes that kept the host busy, and how many
// CPUs each: " (broker 1.02, bench 0.37, worker 0.54, Redis 0.16 CPUs)".
func (l *Latency) coresText() string {
	var parts []string
	for _, p := range []struct{ key, name string }{{"broker", "broker"}, {"bench", "bench"}, {"worker", "worker"}, {"redis", "Redis"}} {
		if c, ok := l.Cores[p.key]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", p.name, c))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + " CPUs)"
}

// Memory is Redis' memory for the keys of one Klaxon run.
type Memory struct {
	Workers     int      `json:"workers"`
	Events      int      `json:"events"`
	Groups      int      `json:"groups"`
	UsedDelta   int64    `json:"usedMemoryDeltaBytes"`
	Keys        int      `json:"keys"`
	PerKey      float64  `json:"usedMemoryPerKeyBytes"`
	Stats       keyStats `json:"keyStats"`
	DedupPerEvt float64  `json:"dedupBytesPerEvent"`
}

// percentile is the p-th percentile (0 < p ≤ 100) of sorted values by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. It returns 0 for no values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// summarize fills the percentiles of l from the latencies.
func (l *Latency) summarize(lat, fired []time.Duration) {
	s := slices.Sorted(slices.Values(lat))
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	l.Received = len(s)
	l.P50, l.P95, l.P99 = ms(percentile(s, 50)), ms(percentile(s, 95)), ms(percentile(s, 99))
	if len(s) > 0 {
		l.Max = ms(s[len(s)-1])
	}
	f := slices.Sorted(slices.Values(fired))
	l.FiredP50, l.FiredP99 = ms(percentile(f, 50)), ms(percentile(f, 99))
}

// name is how the table names a result.
func (r Result) name() string {
	if r.Queues > 1 {
		return fmt.Sprintf("%s, %d queues", r.baseName(), r.Queues)
	}
	return r.baseName()
}

func (r Result) baseName() string {
	switch r.System {
	case "ceiling":
		return "bare consumer (ack only)"
	case "hawk":
		return "Hawk-style (EVALSHA/rule/event)"
	case "klaxon":
		if r.Variant != "" {
			return fmt.Sprintf("Klaxon %s, %d worker%s", r.Variant, r.Workers, plural(r.Workers))
		}
		return fmt.Sprintf("Klaxon, %d worker%s", r.Workers, plural(r.Workers))
	}
	return r.System
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// writeTable prints the report as the table of docs/benchmarks.md.
func writeTable(w io.Writer, rep *Report) {
	s, h := rep.Settings, rep.Host
	fmt.Fprintf(w, "%s events, %s projects × %d rules, %s groups (%.0f%% new), threshold %d, seed %d; %d cores; load average %.2f at start, %.2f at end\n",
		thousands(float64(s.Events)), thousands(float64(s.Projects)), s.Rules, thousands(float64(s.Groups)), s.NewGroups*100,
		s.Threshold, s.Seed, h.Cores, h.LoadStart[0], h.LoadEnd[0])
	mode := ""
	if s.QueueMode != "" {
		mode = ", incoming queues " + s.QueueMode
	}
	if s.Workload != "" {
		mode += ", workload " + s.Workload + " (threshold per rule)"
	}
	if s.LatencyPublish == "hawk" {
		mode += ", latency events transient and unconfirmed (as Hawk publishes)"
	}
	fmt.Fprintf(w, "Redis %s, RabbitMQ %s%s, %s\n\n", h.Redis, h.RabbitMQ, mode, h.Go)

	header := []string{"system", "events/s", "of ceiling", "Redis trips/ev", "Redis cmds/ev", "scripts/ev",
		"CPU µs/ev worker", "Redis", "broker", "worker RSS", "latency p50 / p95 / p99 (ms)"}
	rows := [][]string{header}
	for _, r := range rep.Results {
		row := []string{
			r.name(),
			thousands(r.EventsPerSec),
			percent(r.CeilingRatio),
			fmt.Sprintf("%.3f", r.PerEvent.RoundTrips),
			fmt.Sprintf("%.2f", r.PerEvent.Commands),
			fmt.Sprintf("%.3f", r.PerEvent.Scripts),
			fmt.Sprintf("%.1f", r.PerEvent.WorkerCPU),
			fmt.Sprintf("%.1f", r.PerEvent.RedisCPU),
			fmt.Sprintf("%.1f", r.PerEvent.BrokerCPU),
			"–",
			"–",
		}
		if r.WorkerRSS > 0 {
			row[9] = fmt.Sprintf("%.0f MiB", float64(r.WorkerRSS)/(1<<20))
		}
		if l := r.Latency; l != nil {
			row[10] = fmt.Sprintf("%.1f / %.1f / %.1f at %s/s", l.P50, l.P95, l.P99, thousands(l.Rate))
			if l.HostBusy > 0 {
				row[10] += fmt.Sprintf(", host %.0f%% busy", 100*l.HostBusy) + l.coresText()
			}
			if l.WorkerCPU > 0 {
				row[10] += fmt.Sprintf(", worker %.0f µs/ev", l.WorkerCPU)
			}
			if l.Received < l.Probes {
				row[10] += fmt.Sprintf(" (%d of %d probes)", l.Received, l.Probes)
			}
			if l.Deferred > 0 {
				row[10] += fmt.Sprintf(", %d notification%s put back for their turn", l.Deferred, plural(l.Deferred))
			}
			if r.System != "ceiling" {
				row[10] += fmt.Sprintf("; to the firing p50 / p99 %.0f / %.0f", l.FiredP50, l.FiredP99)
			}
		}
		rows = append(rows, row)
	}
	writeMarkdown(w, rows)

	if r := rep.Rules; r != nil {
		fmt.Fprintf(w, "\nRules file: %s rules in %s; one load (KLAXON_RULES_FILE, repeated every KLAXON_RULES_REFRESH) takes %.0f ms and allocates %s.\n",
			thousands(float64(r.Rules)), bytesHuman(r.Bytes), r.Millis, bytesHuman(r.AllocBytes))
	}
	if m := rep.Memory; m != nil {
		fmt.Fprintf(w, "\nRedis memory after %s events over %s groups (Klaxon, %d worker%s): used_memory +%s in %s keys = %.0f B/key;\n",
			thousands(float64(m.Events)), thousands(float64(m.Groups)), m.Workers, plural(m.Workers),
			bytesHuman(m.UsedDelta), thousands(float64(m.Keys)), m.PerKey)
		fmt.Fprintf(w, "%s group state keys, MEMORY USAGE %.0f B each, of which %.0f B are ids; %s pages of ids, %.0f B each; ids: %.1f B per event\n",
			thousands(float64(m.Stats.States)), m.Stats.StateBytes, m.Stats.InlineBytes, thousands(float64(m.Stats.Pages)),
			m.Stats.PageBytes, m.DedupPerEvt)
	}
	fmt.Fprintln(w, "\nRedis trips: increase of INFO total_writes_processed (one reply write per client round trip). Redis cmds: increase of")
	fmt.Fprintln(w, "INFO commandstats calls, commands run inside scripts included. CPU: utime+stime from /proc/<pid>/stat over the")
	fmt.Fprintln(w, "measured span; 'worker' is the bench process itself for the bare consumer and Hawk-style rows.")
	for _, r := range rep.Results {
		if len(r.Redis.Calls) == 0 {
			continue
		}
		fmt.Fprintf(w, "  %s: %s\n", r.name(), r.Redis.topCalls(8))
		if d := r.Redis; d.Scripts > 0 {
			fmt.Fprintf(w, "    scripts: %.1f µs per call, %.1f µs per event; of which %.1f µs per event in the commands they call, %.1f µs in Lua\n",
				float64(d.ScriptMicros)/float64(d.Scripts), float64(d.ScriptMicros)/float64(r.Events),
				float64(d.ScriptCommandMicros)/float64(r.Events), float64(d.ScriptMicros-d.ScriptCommandMicros)/float64(r.Events))
		}
		if d := r.Redis; float64(d.DirectMicros)/float64(r.Events) >= 0.05 { // not the odd GET of a script-only build
			fmt.Fprintf(w, "    outside scripts (GET, TIME): %.1f µs per event\n", float64(d.DirectMicros)/float64(r.Events))
		}
	}
}

// writeMarkdown prints rows as a Markdown table with aligned columns, the
// first row as header; columns but the first are right-aligned.
func writeMarkdown(w io.Writer, rows [][]string) {
	if len(rows) == 0 {
		return
	}
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			width[i] = max(width[i], len([]rune(cell)))
		}
	}
	line := func(row []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, cell := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(cell)))
			if i == 0 {
				b.WriteString(" " + cell + pad + " |")
			} else {
				b.WriteString(" " + pad + cell + " |")
			}
		}
		fmt.Fprintln(w, b.String())
	}
	line(rows[0])
	sep := make([]string, len(width))
	for i, n := range width {
		if i == 0 {
			sep[i] = strings.Repeat("-", n+2)
		} else {
			sep[i] = strings.Repeat("-", n+1) + ":"
		}
	}
	fmt.Fprintln(w, "|"+strings.Join(sep, "|")+"|")
	for _, row := range rows[1:] {
		line(row)
	}
}

// thousands formats a number rounded to an integer with comma separators.
func thousands(v float64) string {
	n := int64(math.Round(v))
	neg := n < 0
	if neg {
		n = -n
	}
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func percent(r float64) string {
	if r <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", r*100)
}

func bytesHuman(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
