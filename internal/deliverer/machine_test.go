package deliverer

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/pacing"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// The state machine's tests: claim → send → settle, retries and digests,
// driven through the deliverer's seams (Config.Now, Publisher) with no
// broker and no wall-clock wait. Redis is the real one, under a prefix of
// the test's own; the broker is a list of what the deliverer published,
// which the test hands back as the broker would when the delay expires.

// fakeBroker keeps what the deliverer publishes.
type fakeBroker struct {
	mu   sync.Mutex
	msgs []queue.Message
}

func (b *fakeBroker) Publish(_ context.Context, msgs ...queue.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.msgs = append(b.msgs, msgs...)
	return nil
}

// take returns what was published since the last take.
func (b *fakeBroker) take() []queue.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.msgs
	b.msgs = nil
	return out
}

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// reply is what the fake provider says to one send.
type reply struct {
	status     int           // 0: accepted
	retryAfter time.Duration // a Retry-After header, if any
}

// provider answers sends as scripted, then accepts everything.
type provider struct {
	mu      sync.Mutex
	answers []reply
	got     []*notify.Message
}

func (p *provider) Notify(_ context.Context, _ string, m *notify.Message) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, m)
	if len(p.answers) == 0 {
		return false, nil
	}
	a := p.answers[0]
	p.answers = p.answers[1:]
	if a.status == 0 {
		return false, nil
	}
	var err error = &notify.HTTPError{Channel: "webhook", StatusCode: a.status}
	if a.retryAfter > 0 {
		err = notify.WithRetryAfter(err, a.retryAfter)
	}
	return notify.RetryableStatus(a.status), err
}

func (p *provider) sent() []*notify.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

type machine struct {
	t      *testing.T
	d      *Deliverer
	broker *fakeBroker
	clock  *fakeClock
	ch     *provider
	tag    uint64
}

func newMachine(t *testing.T, answers ...reply) *machine {
	t.Helper()
	m := &machine{t: t, broker: &fakeBroker{}, clock: &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
		ch: &provider{answers: answers}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m.d = New(Config{Prefix: testenv.KeyPrefix(t), Now: m.clock.now, Limits: map[string][]pacing.Limit{},
		Redis: testenv.Redis(t), Publisher: m.broker, Channels: map[string]notify.Channel{"webhook": m.ch}, Logger: log, Metrics: metrics.New(prometheus.NewRegistry())})
	return m
}

// handle hands the deliverer one delivery, as the consumer would.
func (m *machine) handle(body []byte) {
	m.t.Helper()
	m.tag++
	b := &queue.Batch{Deliveries: []queue.Delivery{{Body: body, DeliveryTag: m.tag}}}
	if err := m.d.Handle(m.t.Context(), b); err != nil {
		m.t.Fatalf("Handle: %v", err)
	}
}

// published returns the one message published since the last look, and
// checks that it went to one of queues.
func (m *machine) published(queues ...string) (queue.Message, wire.Job) {
	m.t.Helper()
	msgs := m.broker.take()
	if len(msgs) != 1 || !slices.Contains(queues, msgs[0].RoutingKey) {
		var keys []string
		for _, msg := range msgs {
			keys = append(keys, msg.RoutingKey)
		}
		m.t.Fatalf("published to %v, want one message to one of %v", keys, queues)
	}
	var j wire.Job
	if err := json.Unmarshal(msgs[0].Body, &j); err != nil {
		m.t.Fatal(err)
	}
	return msgs[0], j
}

func (m *machine) nothingPublished() {
	m.t.Helper()
	if msgs := m.broker.take(); len(msgs) != 0 {
		m.t.Fatalf("published %d messages, first to %s; want none", len(msgs), msgs[0].RoutingKey)
	}
}

func (m *machine) record(id string) string {
	return m.d.rdb.Get(m.t.Context(), m.d.claimKey(id+":webhook")).Val()
}

func firing(t *testing.T, id string, minPeriod time.Duration) []byte {
	t.Helper()
	body, err := json.Marshal(oneFiring("webhook", "https://example.com/hook", "r", minPeriod,
		&notify.Notification{ID: id, Type: notify.TypeNew, FiredAt: time.Unix(1, 0)}))
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// What a provider's answer makes of a job: retried after the backoff or its
// Retry-After, through the retry queues, or failed for good; and back from
// the retry queue, sent.
func TestMachineRetries(t *testing.T) {
	for _, tt := range []struct {
		name  string
		reply reply
		// the retry queues the failure may go to; none when it fails for good
		rungs []time.Duration
		// how long past the longest queue the retry must wait (NotBefore)
		notBefore time.Duration
	}{
		// A 5xx is retried after the backoff: 1 s, or at random half of it.
		{name: "5xx retried after the backoff", reply: reply{status: 503},
			rungs: []time.Duration{500 * time.Millisecond, time.Second}},
		// A short Retry-After does not shorten the backoff, or a provider
		// answering it again and again would use up every attempt at once.
		{name: "short Retry-After keeps the backoff", reply: reply{status: 429, retryAfter: 100 * time.Millisecond},
			rungs: []time.Duration{500 * time.Millisecond, time.Second}},
		{name: "Retry-After longer than the backoff honoured", reply: reply{status: 429, retryAfter: 30 * time.Second},
			rungs: []time.Duration{32 * time.Second}},
		// Longer than the longest retry queue: the job goes round it until
		// the provider's time has come, without spending attempts.
		{name: "Retry-After past the longest queue", reply: reply{status: 503, retryAfter: 20 * time.Minute},
			rungs: []time.Duration{512 * time.Second}, notBefore: 20 * time.Minute},
		// A 4xx other than 408 and 429 fails for good at once.
		{name: "4xx fails for good", reply: reply{status: 404}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := newMachine(t, tt.reply)
			m.handle(firing(t, "n1", 0))
			if len(tt.rungs) == 0 {
				msg, j := m.published(m.d.cfg.FailedQueue)
				if reason, _ := msg.Headers[wire.ErrorHeader].(string); !strings.Contains(reason, "HTTP 404") || j.Attempt != 0 {
					t.Errorf("failed job: reason %q, attempt %d", reason, j.Attempt)
				}
				if got := m.record("n1"); got != "failed" {
					t.Errorf("record %q, want failed", got)
				}
				return
			}
			var queues []string
			for _, r := range tt.rungs {
				queues = append(queues, m.d.delayQueue(r))
			}
			msg, j := m.published(queues...)
			if j.Attempt != 1 {
				t.Errorf("retry is attempt %d, want 1", j.Attempt)
			}
			if got := m.record("n1"); got != "" {
				t.Errorf("record %q while the retry waits, want the claim released", got)
			}
			if tt.notBefore > 0 {
				if want := m.clock.now().Add(tt.notBefore); !j.NotBefore.Equal(want) {
					t.Errorf("NotBefore %v, want %v", j.NotBefore, want)
				}
				// Back before its time: round the longest queue again, unsent.
				m.handle(msg.Body)
				again, aj := m.published(m.d.delayQueue(512 * time.Second))
				if n := len(m.ch.sent()); n != 1 || aj.Attempt != 1 {
					t.Fatalf("back early: %d sends, attempt %d; want 1 send, attempt 1", n, aj.Attempt)
				}
				m.clock.advance(tt.notBefore)
				msg = again
			}
			m.handle(msg.Body)
			m.nothingPublished()
			if n, got := len(m.ch.sent()), m.record("n1"); n != 2 || got != "sent" {
				t.Errorf("after the retry: %d sends, record %q; want 2 and sent", n, got)
			}
		})
	}
}

// A job delivered again after it was sent (a producer's repeat, a
// redelivery after a lost ack) is not sent again.
func TestMachineDuplicateJobSkipped(t *testing.T) {
	m := newMachine(t)
	m.handle(firing(t, "n1", 0))
	m.handle(firing(t, "n1", 0))
	m.nothingPublished()
	if n := len(m.ch.sent()); n != 1 {
		t.Errorf("%d sends, want 1", n)
	}
	if v := counterValue(t, m.d, "webhook", "duplicate"); v != 1 {
		t.Errorf("%v duplicates counted, want 1", v)
	}
}

// Within a minPeriod, the first firing goes at once and the next two are
// gathered into one digest, sent by the flush job once the period is over.
func TestMachineDigestOfTwoFirings(t *testing.T) {
	m := newMachine(t)
	m.handle(firing(t, "n1", time.Minute))
	m.nothingPublished()
	m.handle(firing(t, "n2", time.Minute))
	flush, fj := m.published(m.d.delayQueue(32 * time.Second)) // the longest rung not past the minute
	if fj.Kind != wire.KindFlush {
		t.Fatalf("scheduled %+v, want a flush job", fj)
	}
	m.handle(firing(t, "n3", time.Minute)) // gathered: its flush is scheduled already
	m.nothingPublished()
	if got := m.record("n2") + " " + m.record("n3"); got != "digested digested" {
		t.Errorf("records %q, want both digested", got)
	}

	// Early (Redis' clock, not the test's, keeps minPeriods): flush.lua
	// says when to come back.
	m.handle(flush.Body)
	flush, _ = m.published(queuesUpTo(m.d, time.Minute)...)
	// The period over, as if a minute had passed on Redis' clock.
	keys := m.d.minPeriodKeys(&fj)
	if err := m.d.rdb.HIncrBy(m.t.Context(), keys.state, "last", -time.Minute.Milliseconds()).Err(); err != nil {
		t.Fatal(err)
	}
	m.handle(flush.Body)
	m.nothingPublished()
	sent := m.ch.sent()
	if len(sent) != 2 {
		t.Fatalf("%d messages sent, want the first firing and one digest", len(sent))
	}
	var ids []string
	for _, n := range sent[1].Notifications {
		ids = append(ids, n.ID)
	}
	if d := sent[1]; !d.Digest || !slices.Equal(ids, []string{"n2", "n3"}) || !strings.HasPrefix(d.ID, "digest-") {
		t.Errorf("second message: digest %v, firings %v, id %s; want a digest of n2 and n3", d.Digest, ids, d.ID)
	}
	if got := m.d.rdb.Get(m.t.Context(), m.d.claimKey(sent[1].ID+":webhook")).Val(); got != "sent" {
		t.Errorf("digest record %q, want sent", got)
	}
}

// queuesUpTo are the retry queues of delays up to d.
func queuesUpTo(d *Deliverer, max time.Duration) []string {
	var out []string
	for _, l := range delays {
		if l <= max {
			out = append(out, d.delayQueue(l))
		}
	}
	return out
}
