package queue_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// broker is the test's own admin connection, for what the code under test
// must not be trusted to report: queue depths, raw gets, deletes.
type broker struct {
	t    testing.TB
	url  string
	conn *amqp.Connection
}

// newBroker connects to the test RabbitMQ (testenv.AMQPURL); these tests
// never fake the broker.
func newBroker(t testing.TB) *broker {
	t.Helper()
	u := testenv.AMQPURL(t)
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		t.Fatalf("admin connection to RabbitMQ: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &broker{t: t, url: u, conn: conn}
}

// channel opens a fresh channel: a failed passive declare closes the one it ran on.
func (b *broker) channel() *amqp.Channel {
	b.t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		b.t.Fatalf("admin channel: %v", err)
	}
	return ch
}

// queueName returns a unique name, deleting the queue (and its companions
// with the given suffixes) when the test ends.
func (b *broker) queueName(suffixes ...string) string {
	b.t.Helper()
	name := fmt.Sprintf("klaxon-test-%s-%s", strings.ReplaceAll(b.t.Name(), "/", "-"), rand.Text()[:8])
	b.t.Cleanup(func() {
		ch, err := b.conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		for _, s := range append([]string{""}, suffixes...) {
			_, _ = ch.QueueDelete(name+s, false, false, false)
		}
	})
	return name
}

func (b *broker) declare(name string, args amqp.Table) {
	b.t.Helper()
	ch := b.channel()
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		b.t.Fatalf("declare %s: %v", name, err)
	}
}

// queueType tells a quorum queue from a classic one: AMQP's declare-ok does
// not say, but a declaration of the queue's own args (the ones besides its
// type) succeeds with x-queue-type quorum only on a quorum queue. It runs on
// a channel of its own, which the failure closes.
func (b *broker) queueType(name string, args amqp.Table) queue.Type {
	b.t.Helper()
	ch := b.channel()
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(name, true, false, false, false, nil); err != nil {
		b.t.Fatalf("queue %s: %v", name, err)
	}
	probe := amqp.Table{"x-queue-type": "quorum"}
	for k, v := range args {
		if k != "x-queue-type" {
			probe[k] = v
		}
	}
	ch2 := b.channel()
	if _, err := ch2.QueueDeclare(name, true, false, false, false, probe); err != nil {
		return queue.Classic
	}
	_ = ch2.Close()
	return queue.Quorum
}

// ready is the number of messages ready in the queue, -1 if it does not exist.
func (b *broker) ready(name string) int {
	b.t.Helper()
	ch := b.channel()
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return q.Messages
}

func (b *broker) waitReady(name string, want int, within time.Duration) {
	b.t.Helper()
	got := 0
	if !testenv.Eventually(within, func() bool { got = b.ready(name); return got == want }) {
		b.t.Fatalf("queue %s holds %d ready messages after %s, want %d", name, got, within, want)
	}
}

// fill publishes n messages with ids "m<i>" through the code under test.
func fill(t testing.TB, p *queue.Publisher, q string, n int) {
	t.Helper()
	const chunk = 1000
	for i := 0; i < n; i += chunk {
		msgs := make([]queue.Message, 0, chunk)
		for j := i; j < min(n, i+chunk); j++ {
			id := fmt.Sprintf("m%d", j)
			msgs = append(msgs, queue.Message{RoutingKey: q, MessageID: id, Body: []byte(`{"n":"` + id + `"}`), ContentType: "application/json"})
		}
		if err := p.Publish(t.Context(), msgs...); err != nil {
			t.Fatalf("fill %s: %v", q, err)
		}
	}
}

// receive waits for a value on c.
func receive[T any](t testing.TB, c <-chan T, within time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(within):
		t.Fatalf("timed out after %s waiting for %s", within, what)
		panic("unreachable")
	}
}

// logger writes to the test's output, and keeps a copy to inspect.
type logger struct {
	mu  sync.Mutex
	buf bytes.Buffer
	out io.Writer
}

func newLogger(t testing.TB) (*slog.Logger, *logger) {
	l := &logger{out: t.Output()}
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})), l
}

func (l *logger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	return l.out.Write(p)
}

func (l *logger) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newPublisher(t testing.TB, cfg queue.PublisherConfig) *queue.Publisher {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = testenv.AMQPURL(t)
	}
	if cfg.Logger == nil {
		cfg.Logger, _ = newLogger(t)
	}
	p, err := queue.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// running is a Consume call in the background.
type running struct {
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

func startConsumer(t testing.TB, cfg queue.ConsumerConfig, h queue.Handler) (*queue.Consumer, *running) {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = testenv.AMQPURL(t)
	}
	if cfg.Logger == nil {
		cfg.Logger, _ = newLogger(t)
	}
	c, err := queue.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Consume(ctx, h) }()
	t.Cleanup(func() { r.stop(t, 10*time.Second) })
	return c, r
}

// stop cancels Consume and waits for it to return, within the given time.
// Later calls return at once.
func (r *running) stop(t testing.TB, within time.Duration) time.Duration {
	t.Helper()
	if r.stopped {
		return 0
	}
	r.stopped = true
	start := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Consume returned %v", err)
		}
	case <-time.After(within):
		// Errorf, not Fatalf: some tests stop from another goroutine.
		t.Errorf("Consume did not return within %s of cancel", within)
	}
	return time.Since(start)
}

// proxy forwards TCP to the broker, so a test can cut its connections the way
// a network failure does, without touching anyone else's.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn

	// gate stops broker→client traffic while write-locked (see hold).
	gate sync.RWMutex
	held bool
}

// proxyListener listens on a free local port for a proxy to the test
// broker, at target; u is the broker's URL, to point at the listener.
func proxyListener(t testing.TB) (ln net.Listener, target string, u *url.URL) {
	t.Helper()
	u, err := url.Parse(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	target = u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5672")
	}
	return ln, target, u
}

// acceptPairs accepts clients on ln until it closes, dials target for each
// and hands the pair to handle.
func acceptPairs(ln net.Listener, target string, handle func(client, broker net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			continue
		}
		handle(c, up)
	}
}

func newProxy(t testing.TB) (*proxy, string) {
	t.Helper()
	ln, target, u := proxyListener(t)
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *proxy) accept() {
	acceptPairs(p.ln, p.target, func(c, up net.Conn) {
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(up, c); _ = up.Close() })
		p.wg.Go(func() { p.down(c, up); _ = c.Close() })
	})
}

// down copies broker→client, passing the gate for every chunk.
func (p *proxy) down(c, up net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			p.gate.RLock()
			_, werr := c.Write(buf[:n])
			p.gate.RUnlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// hold stops passing anything from the broker to clients (confirms, acks,
// deliveries) until cut.
func (p *proxy) hold() {
	p.gate.Lock()
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// cut closes every connection through the proxy, and says how many it cut.
func (p *proxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		p.held = false
		defer p.gate.Unlock()
	}
	for _, c := range p.conns {
		_ = c.Close()
	}
	n := len(p.conns) / 2
	p.conns = nil
	return n
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.cut()
	p.wg.Wait()
}

// closeConnection asks the broker to close the connection the client named
// name, as `rabbitmqctl close_all_connections` or a broker shutdown does.
// It skips the test where rabbitmqctl cannot reach the broker (e.g. RabbitMQ
// in a container): the proxy tests cover reconnecting there.
func closeConnection(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("rabbitmqctl not found; the proxy tests cover reconnects")
	}
	var pid string
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("a broker connection named %q", name), func() bool {
		out, err := exec.Command("rabbitmqctl", "list_connections", "--silent", "pid", "client_properties").CombinedOutput()
		if err != nil {
			t.Skipf("rabbitmqctl list_connections: %v: %s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, `"`+name+`"`) {
				pid, _, _ = strings.Cut(line, "\t")
				return true
			}
		}
		return false
	})
	out, err := exec.Command("rabbitmqctl", "close_connection", pid, "klaxon test: forced close").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl close_connection %s: %v: %s", pid, err, out)
	}
}

// transitions records Hooks.Connection calls.
type transitions struct {
	mu  sync.Mutex
	log []bool
}

func (tr *transitions) hook(up bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.log = append(tr.log, up)
}

func (tr *transitions) get() []bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]bool(nil), tr.log...)
}

// reconnected reports whether the log shows up, down, up.
func (tr *transitions) reconnected() bool {
	l := tr.get()
	return len(l) >= 3 && l[0] && !l[1] && l[2]
}

var errBoom = errors.New("boom: pretend Redis is down")

// drainThenStop waits until n deliveries are acked, stops the consumer and
// checks that each of the n messages was handled exactly once.
func (l *ledger) drainThenStop(t *testing.T, r *running, n int) {
	t.Helper()
	if !testenv.Eventually(10*time.Second, func() bool { return l.ackedCount() == n }) {
		t.Fatalf("acked %d of %d", l.ackedCount(), n)
	}
	r.stop(t, 10*time.Second)
	l.exactlyOnce(t, n)
}
