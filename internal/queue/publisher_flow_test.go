package queue_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// A broker that stops answering (overloaded, partitioned, or blocking the
// connection) must not hold Publish past its ctx: not while it opens a
// channel, not while it waits for confirms, and not while it gives up the
// channel those confirms were due on.
func TestPublishHonoursContextWhenTheBrokerStopsAnswering(t *testing.T) {
	for _, warm := range []bool{false, true} {
		name := "new channel"
		if warm {
			name = "pooled channel"
		}
		t.Run(name, func(t *testing.T) {
			px, viaProxy := newProxy(t)
			_, pub, q := declaredVia(t, viaProxy)
			if warm {
				if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q}); err != nil {
					t.Fatal(err)
				}
			}
			px.hold() // nothing from the broker gets through: no confirm, no open-ok, no close-ok
			defer px.cut()
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			err := publishWithin(t, pub, ctx, 3*time.Second, func() { px.cut() }, queue.Message{RoutingKey: q})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err = %v, want the deadline", err)
			}
			t.Log(err)
		})
	}
}

// What a call left running when its ctx ended ends with Close: no goroutine
// outlives the Publisher.
func TestCloseEndsCallsLeftRunning(t *testing.T) {
	px, viaProxy := newProxy(t)
	_, pub, q := declaredVia(t, viaProxy)
	px.hold()
	defer px.cut()
	for range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_ = publishWithin(t, pub, ctx, 3*time.Second, func() { px.cut() }, queue.Message{RoutingKey: q})
		cancel()
	}
	if n := goroutinesIn("queue.(*pubConn)", "queue.(*pubChannel)"); n == 0 {
		t.Fatal("no call left running: the test proves nothing")
	}
	start := time.Now()
	_ = pub.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Close took %s", took)
	}
	if n := goroutinesIn("queue.(*pubConn)", "queue.(*pubChannel)"); n > 0 {
		t.Errorf("%d publisher goroutines outlive Close", n)
	}
}

// goroutinesIn counts the goroutines running code of any of the named
// functions or types of this package, such as "queue.(*pubConn)".
func goroutinesIn(names ...string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if slices.ContainsFunc(names, func(name string) bool { return strings.Contains(g, name) }) {
			n++
		}
	}
	return n
}

// Under RabbitMQ's flow control (connection.blocked, sent when a memory or
// disk alarm is raised) the broker stops reading the connection: whatever is
// written waits in socket buffers. Publish must wait for connection.unblocked
// or its ctx, and not write meanwhile.
func TestPublishWaitsOutFlowControl(t *testing.T) {
	fx, viaProxy := newFlowProxy(t)
	log, logs := newLogger(t)
	b, pub, q := declaredWith(t, queue.PublisherConfig{URL: viaProxy, Logger: log})
	if err := pub.Publish(t.Context(), queue.Message{RoutingKey: q, MessageID: "before"}); err != nil {
		t.Fatal(err)
	}

	fx.block(t, "low on memory")
	testenv.WaitFor(t, 5*time.Second, "the publisher to read connection.blocked", func() bool {
		return strings.Contains(logs.String(), "rabbitmq blocks publishing")
	})
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := publishWithin(t, pub, ctx, 3*time.Second, func() { fx.unblock(t) }, queue.Message{RoutingKey: q, MessageID: "given up"})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "low on memory") {
		t.Errorf("err = %v, want the deadline, naming the broker's reason", err)
	}
	t.Log(err)

	// A call with time to spare waits for the block to lift, then succeeds.
	done := make(chan error, 1)
	go func() { done <- pub.Publish(t.Context(), queue.Message{RoutingKey: q, MessageID: "after"}) }()
	testenv.WaitFor(t, 5*time.Second, "Publish to wait for the block to lift", func() bool {
		return goroutinesIn("queue.(*pubConn).waitUnblocked") > 0
	})
	select {
	case err := <-done:
		t.Fatalf("Publish returned %v while the broker blocked publishing", err)
	default:
	}
	fx.unblock(t)
	if err := receive(t, done, 5*time.Second, "Publish after connection.unblocked"); err != nil {
		t.Fatal(err)
	}
	// Nothing was written during the block: the given-up message never
	// reached the broker, and no message is stored twice.
	b.waitReady(q, 2, time.Second)
}

// publishWithin runs Publish and fails the test if it has not returned within
// limit; rescue then lets the stuck call finish so the test can end.
func publishWithin(t *testing.T, pub *queue.Publisher, ctx context.Context, limit time.Duration, rescue func(), msgs ...queue.Message) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- pub.Publish(ctx, msgs...) }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		rescue()
		err := <-done
		t.Fatalf("Publish still running %s after it began (then returned %v)", limit, err)
		return nil
	}
}

// flowProxy forwards TCP to the broker and plays RabbitMQ's flow control on
// its connections: block stops reading from the client, as the broker does,
// and hands it a connection.blocked frame; unblock undoes both. (Raising a
// real alarm would block every user of the shared broker.)
type flowProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu      sync.Mutex
	conns   []*flowConn
	blocked bool
	lifted  chan struct{} // closed when the block lifts
}

type flowConn struct {
	client, broker net.Conn
	wmu            sync.Mutex // whole frames to the client
}

func newFlowProxy(t *testing.T) (*flowProxy, string) {
	t.Helper()
	ln, target, u := proxyListener(t)
	p := &flowProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = p.ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.client.Close()
			_ = c.broker.Close()
		}
		if p.blocked {
			close(p.lifted)
			p.blocked = false
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *flowProxy) accept() {
	acceptPairs(p.ln, p.target, func(c, up net.Conn) {
		fc := &flowConn{client: c, broker: up}
		p.mu.Lock()
		p.conns = append(p.conns, fc)
		p.mu.Unlock()
		p.wg.Go(func() { p.up(fc); _ = up.Close() })
		p.wg.Go(func() { fc.down(); _ = c.Close() })
	})
}

// up copies client→broker; while blocked, what it has read waits, and
// nothing more is read.
func (p *flowProxy) up(fc *flowConn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := fc.client.Read(buf)
		if n > 0 {
			p.mu.Lock()
			lifted := p.lifted
			if !p.blocked {
				lifted = nil
			}
			p.mu.Unlock()
			if lifted != nil {
				<-lifted
			}
			if _, werr := fc.broker.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// down copies broker→client frame by frame, so that frames can be slipped in.
func (fc *flowConn) down() {
	hdr := make([]byte, 7)
	for {
		if _, err := io.ReadFull(fc.broker, hdr); err != nil {
			return
		}
		frame := make([]byte, 7+int(binary.BigEndian.Uint32(hdr[3:]))+1)
		copy(frame, hdr)
		if _, err := io.ReadFull(fc.broker, frame[7:]); err != nil {
			return
		}
		if err := fc.send(frame); err != nil {
			return
		}
	}
}

func (fc *flowConn) send(frame []byte) error {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	_, err := fc.client.Write(frame)
	return err
}

// method builds a channel-0 method frame of the connection class (10).
func method(id uint16, args []byte) []byte {
	payload := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, 10), id)
	payload = append(payload, args...)
	frame := append([]byte{1, 0, 0}, binary.BigEndian.AppendUint32(nil, uint32(len(payload)))...)
	return append(append(frame, payload...), 0xCE)
}

// block blocks every connection through the proxy. The client reads the
// connection.blocked frame when it gets to it: a test waits for it to say so.
func (p *flowProxy) block(t *testing.T, reason string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked, p.lifted = true, make(chan struct{})
	for _, c := range p.conns {
		if err := c.send(method(60, append([]byte{byte(len(reason))}, reason...))); err != nil {
			t.Fatalf("send connection.blocked: %v", err)
		}
	}
}

func (p *flowProxy) unblock(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.blocked {
		return
	}
	p.blocked = false
	close(p.lifted)
	for _, c := range p.conns {
		_ = c.send(method(61, nil)) // connection.unblocked
	}
}

// declaredVia is a publisher on url with a fresh queue of the test broker
// declared.
func declaredVia(t *testing.T, url string) (*broker, *queue.Publisher, string) {
	t.Helper()
	return declaredWith(t, queue.PublisherConfig{URL: url})
}

// declaredWith is declaredVia for a publisher configured as in cfg.
func declaredWith(t *testing.T, cfg queue.PublisherConfig) (*broker, *queue.Publisher, string) {
	t.Helper()
	b := newBroker(t)
	q := b.queueName()
	pub := newPublisher(t, cfg)
	if err := pub.Declare(t.Context(), q, nil); err != nil {
		t.Fatal(err)
	}
	return b, pub, q
}
