package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// buildWorker builds ./cmd/worker into dir and returns the binary's path.
func buildWorker(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "klaxon-worker")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/klaxonhq/klaxon/cmd/worker")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/worker: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// worker is one running Klaxon process.
type worker struct {
	cmd     *exec.Cmd
	addr    string // KLAXON_HTTP_ADDR
	logPath string
	exited  chan struct{}
	waitErr error
}

// startWorker runs the worker binary with env (plus a free KLAXON_HTTP_ADDR),
// its stderr to logPath. Only env reaches it, not the bench's environment.
func startWorker(bin string, env map[string]string, logPath string) (*worker, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("worker log: %w", err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"KLAXON_HTTP_ADDR=" + addr, "PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start worker: %w", err)
	}
	w := &worker{cmd: cmd, addr: addr, logPath: logPath, exited: make(chan struct{})}
	go func() {
		w.waitErr = cmd.Wait()
		logf.Close()
		close(w.exited)
	}()
	return w, nil
}

func (w *worker) pid() int { return w.cmd.Process.Pid }

// waitReady polls /readyz until it answers 200.
func (w *worker) waitReady(ctx context.Context, client *http.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-w.exited:
			return fmt.Errorf("worker exited before it was ready (%w); log: %s", w.waitErr, tail(w.logPath, 10))
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+w.addr+"/readyz", nil)
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worker not ready after %s; log: %s", timeout, tail(w.logPath, 10))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and waits for the exit; after 15 s it kills.
func (w *worker) stop() error {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
	case <-time.After(15 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.exited
		return fmt.Errorf("worker %d did not stop within 15 s of SIGTERM", w.pid())
	}
	if w.waitErr != nil {
		return fmt.Errorf("worker %d: %w; log: %s", w.pid(), w.waitErr, tail(w.logPath, 10))
	}
	return nil
}

// metrics reads the worker's counters of interest from /metrics: the sum
// of klaxon_events_total over outcomes ("events"), the dead-lettered among
// them ("dead"), and the evaluator's batches ("batches").
func (w *worker) metrics(ctx context.Context, client *http.Client) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+w.addr+"/metrics", nil)
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape worker metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape worker metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics sums the Prometheus text exposition lines the bench needs.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{"events": 0, "dead": 0, "batches": 0, "deferred": 0}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		keys := metricKeys(line)
		if len(keys) == 0 {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		for _, key := range keys {
			out[key] += v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

// metricKeys names the sums of parseMetrics a line adds to: a dead-lettered
// event counts among the events too.
func metricKeys(line string) []string {
	switch {
	case strings.HasPrefix(line, `klaxon_events_total{`) && strings.Contains(line, `outcome="dead"`):
		return []string{"events", "dead"}
	case strings.HasPrefix(line, "klaxon_events_total{"):
		return []string{"events"}
	case strings.HasPrefix(line, `klaxon_batches_total{`) && strings.Contains(line, `stage="evaluator"`):
		return []string{"batches"}
	case strings.HasPrefix(line, `klaxon_notifications_total{`) &&
		(strings.Contains(line, `outcome="deferred"`) || strings.Contains(line, `outcome="throttled"`)):
		// Put back to wait for their turn: each waits at least 100 ms.
		return []string{"deferred"}
	}
	return nil
}

// sumMetrics adds up one counter over the workers.
func sumMetrics(ctx context.Context, client *http.Client, ws []*worker) (map[string]float64, error) {
	total := map[string]float64{}
	for _, w := range ws {
		m, err := w.metrics(ctx, client)
		if err != nil {
			return nil, err
		}
		for k, v := range m {
			total[k] += v
		}
	}
	return total, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
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
