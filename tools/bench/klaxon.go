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
	"syscall"
	"time"
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
