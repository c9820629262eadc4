package main

// Helpers of faults_test.go: metrics and readiness of a running worker, a
// TCP proxy that can cut and refuse connections, a redis-server of the
// test's own, and views of the broker's queues.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

var httpClient = &http.Client{Timeout: 5 * time.Second}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// metrics scrapes the worker's /metrics.
func (w *worker) metrics(t testing.TB) []sample {
	t.Helper()
	resp, err := httpClient.Get("http://" + w.Addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape /metrics: %v", err)
	}
	defer resp.Body.Close()
	var out []sample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read /metrics: %v", err)
	}
	return out
}

// parseSample parses `name{k="v",…} value` or `name value`.
func parseSample(line string) (sample, error) {
	s := sample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return s, errors.New("no value")
	}
	s.name, line = line[:i], line[i:]
	if line[0] == '{' {
		line = line[1:]
		for line[0] != '}' {
			eq := strings.IndexByte(line, '=')
			if eq < 0 || len(line) < eq+2 || line[eq+1] != '"' {
				return s, errors.New("malformed label")
			}
			key := line[:eq]
			line = line[eq+2:]
			var val strings.Builder
			for {
				if line == "" {
					return s, errors.New("unterminated label value")
				}
				c := line[0]
				line = line[1:]
				if c == '"' {
					break
				}
				if c == '\\' && line != "" {
					switch line[0] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(line[0])
					}
					line = line[1:]
					continue
				}
				val.WriteByte(c)
			}
			s.labels[key] = val.String()
			line = strings.TrimPrefix(line, ",")
			if line == "" {
				return s, errors.New("unterminated labels")
			}
		}
		line = line[1:]
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return s, errors.New("no value")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("value: %w", err)
	}
	s.value = v
	return s, nil
}

// metric sums the samples named name whose labels include the pairs given
// as "key", "value", …; 0 when there is none.
func (w *worker) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	v, _ := w.metricOK(t, name, labels...)
	return v
}

// metricOK is metric, and whether any sample matched.
func (w *worker) metricOK(t testing.TB, name string, labels ...string) (float64, bool) {
	t.Helper()
	total, found := 0.0, false
	for _, s := range w.metrics(t) {
		if s.name != name {
			continue
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			if s.labels[labels[i]] != labels[i+1] {
				match = false
				break
			}
		}
		if match {
			total += s.value
			found = true
		}
	}
	return total, found
}

// waitMetric polls a metric until cond holds for its value.
func (w *worker) waitMetric(t testing.TB, timeout time.Duration, what string, cond func(float64) bool, name string, labels ...string) float64 {
	t.Helper()
	var v float64
	testenv.WaitFor(t, timeout, what, func() bool {
		v = w.metric(t, name, labels...)
		return cond(v)
	})
	return v
}

// readyz returns /readyz's status and body.
func (w *worker) readyz(t testing.TB) (int, string) {
	t.Helper()
	resp, err := httpClient.Get("http://" + w.Addr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// tcpProxy forwards TCP connections to a target, so a test can take a
// dependency away from one worker without touching the service itself:
// cut closes every connection, refuse makes new ones fail at once.
type tcpProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	refusing bool
	held     bool
	// holdOn, when set, holds replies from the first request that contains
	// it on (see holdOnRequest).
	holdOn []byte

	// gate stops target→client traffic while write-locked (see hold).
	gate sync.RWMutex
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.release()
		p.wg.Wait()
	})
	return p
}

// Addr is host:port to connect to instead of the target.
func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

// proxyURL returns raw with its host replaced by the proxy's.
func (p *tcpProxy) proxyURL(t testing.TB, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr()
	return u.String()
}

// hostPort is the host:port of a URL, with the scheme's default port.
func hostPort(t testing.TB, raw, defaultPort string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), defaultPort)
	}
	return u.Host
}

func (p *tcpProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refusing := p.refusing
		p.mu.Unlock()
		if refusing {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset, as from a port nobody listens on
			}
			_ = c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.refusing { // refuse was called while dialling
			p.mu.Unlock()
			_ = c.Close()
			_ = up.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn, gated bool) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					if !gated {
						p.mu.Lock()
						on := p.holdOn != nil && bytes.Contains(buf[:n], p.holdOn)
						if on {
							p.holdOn = nil
						}
						p.mu.Unlock()
						if on {
							p.hold()
						}
					}
					if gated {
						p.gate.RLock()
					}
					_, werr := dst.Write(buf[:n])
					if gated {
						p.gate.RUnlock()
					}
					if werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			_ = dst.Close()
			_ = src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pipe(up, c, false) })
		p.wg.Go(func() { pipe(c, up, true) })
	}
}

// cut closes every connection through the proxy and says how many client
// connections it cut.
func (p *tcpProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	n := len(p.conns) / 2
	clear(p.conns)
	return n
}

// holdOnRequest holds replies (see hold) from the moment a client sends a
// request containing what, before the target sees it: the reply to that
// request and all after it are held.
func (p *tcpProxy) holdOnRequest(what string) {
	p.mu.Lock()
	p.holdOn = []byte(what)
	p.mu.Unlock()
}

// hold stops passing anything from the target to the clients (replies)
// until release; what clients send still reaches the target.
func (p *tcpProxy) hold() {
	p.gate.Lock()
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// release undoes hold; what was held is passed on, to the connections
// that are still open.
func (p *tcpProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		p.held = false
		p.gate.Unlock()
	}
}

// refuse makes the proxy reset new connections (on) or forward them again.
func (p *tcpProxy) refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = on
}

// redisProc is a redis-server of the test's own, persisting every write
// (appendfsync always) in a directory that outlives a restart.
type redisProc struct {
	t    testing.TB
	port string
	dir  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error
}

func startRedis(t *testing.T) *redisProc {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found: %v (scripts/services.sh installs it)", err)
	}
	_, port, _ := net.SplitHostPort(freeAddr(t))
	r := &redisProc{t: t, port: port, dir: t.TempDir()}
	r.start()
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.cmd != nil {
			_ = r.cmd.Process.Kill()
			<-r.done
			r.cmd = nil
		}
	})
	return r
}

// URL is the server's redis:// URL.
func (r *redisProc) URL() string { return "redis://127.0.0.1:" + r.port + "/0" }

// start runs redis-server on the port and directory of r, and waits until
// it answers.
func (r *redisProc) start() {
	r.t.Helper()
	cmd := exec.Command("redis-server",
		"--port", r.port, "--bind", "127.0.0.1", "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--daemonize", "no", "--logfile", r.dir+"/redis.log")
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + r.port, MaxRetries: -1})
	defer rdb.Close()
	testenv.WaitFor(r.t, 20*time.Second, "redis-server on port "+r.port+" to answer", func() bool {
		select {
		case err := <-done:
			log, _ := os.ReadFile(r.dir + "/redis.log")
			r.t.Fatalf("redis-server exited: %v\n%s", err, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return rdb.Ping(ctx).Err() == nil
	})
}

// stop sends SIGTERM, as an orderly shutdown does, and waits until the
// server has exited.
func (r *redisProc) stop() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		r.t.Fatalf("SIGTERM redis-server: %v", err)
	}
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		r.t.Fatal("redis-server did not exit within 20 s of SIGTERM")
	}
	r.cmd = nil
}

// withChannel runs f on a channel of a new connection to the broker.
func withChannel(t testing.TB, amqpURL string, f func(ch *amqp.Channel)) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	f(ch)
}

// readyMessages is the number of messages ready in a queue (not counting
// those delivered and not yet acked).
// deliveryJobsReady is how many delivery jobs wait in both lanes.
func (h *harness) deliveryJobsReady(t testing.TB) int {
	return readyMessages(t, h.amqpURL, h.prefix+".deliveries") + readyMessages(t, h.amqpURL, h.prefix+".deliveries.bulk")
}

func readyMessages(t testing.TB, amqpURL, queue string) int {
	t.Helper()
	n := 0
	withChannel(t, amqpURL, func(ch *amqp.Channel) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("inspect queue %s: %v", queue, err)
		}
		n = q.Messages
	})
	return n
}

// queueMessages returns every message of a queue, ready or delivered and
// not yet acked, as rabbitmqctl sees it; ok is false where rabbitmqctl
// cannot tell (not installed, or the broker is elsewhere).
func queueMessages(t testing.TB, queue string) (ready, unacked int, ok bool) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		return 0, 0, false
	}
	out, err := exec.Command("rabbitmqctl", "list_queues", "-q", "--no-table-headers",
		"name", "messages_ready", "messages_unacknowledged").Output()
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == queue {
			ready, _ = strconv.Atoi(f[1])
			unacked, _ = strconv.Atoi(f[2])
			return ready, unacked, true
		}
	}
	return 0, 0, false
}

// getAll takes every message now in a queue (acking them).
func getAll(t testing.TB, amqpURL, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	withChannel(t, amqpURL, func(ch *amqp.Channel) {
		for {
			d, ok, err := ch.Get(queue, true)
			if err != nil {
				t.Fatalf("get from %s: %v", queue, err)
			}
			if !ok {
				return
			}
			out = append(out, d)
		}
	})
	return out
}

// publishErr publishes msgs to queue and waits for the broker's confirms,
// returning an error instead of failing the test, for goroutines.
func publishErr(amqpURL, queue string, msgs []message) error {
	return publishVia(amqpURL, "", queue, msgs)
}

// publishVia publishes msgs and waits for the broker's confirms: with
// exchange "", to queue (declared if missing); otherwise to the exchange,
// each with its Key as routing key.
func publishVia(amqpURL, exchange, queue string, msgs []message) error {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	if exchange == "" {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare %s: %w", queue, err)
		}
	}
	ctx := context.Background()
	var confirms []*amqp.DeferredConfirmation
	for _, m := range msgs {
		key := queue
		if exchange != "" {
			key = m.Key
		}
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, amqp.Publishing{
			MessageId: m.ID, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(m.Body),
		})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			return fmt.Errorf("publish not confirmed: %v", err)
		}
	}
	return nil
}

// logCount is how many of the worker logs' lines have this msg.
func (h *harness) logCount(msg string) int { return len(h.logs.logLines(msg)) }

// scriptCalls is how many scripts the server has run (EVAL and EVALSHA).
func (r *redisProc) scriptCalls(t testing.TB) int {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + r.port, MaxRetries: -1})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				c, _ := strconv.Atoi(calls)
				n += c
			}
		}
	}
	return n
}
