package deliverer

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/pacing"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// periodJob is a firing for a Slack channel with a minPeriod.
func periodJob(t *testing.T, id string, minPeriod time.Duration) wire.Job {
	t.Helper()
	return oneFiring("slack", "https://hooks.example/T1", "r", minPeriod, &notify.Notification{ID: id, Type: notify.TypeNew, FiredAt: time.Now()})
}

func publishJobs(t *testing.T, pub Publisher, q string, jobs ...wire.Job) {
	t.Helper()
	var msgs []queue.Message
	for _, j := range jobs {
		body, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, queue.Message{RoutingKey: q, Body: body, MessageID: j.Key(), ContentType: "application/json"})
	}
	if err := pub.Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

// sentIDs waits until rec got n messages (20 s at most), then until the
// deliverer is idle, so that no more can come, and returns the ids it got.
func sentIDs(t *testing.T, tr *traffic, rec *recorder, n int) []string {
	t.Helper()
	testenv.Eventually(20*time.Second, func() bool { return len(rec.times()) >= n }) // the caller says what came
	tr.waitIdle(t)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.ids...)
}

// A single firing gathered during the minPeriod is sent when it ends, as a
// digest of one carrying its own id. That id's record already says
// "digested": the digest's send must not take it for done.
func TestDigestOfOneIsSent(t *testing.T) {
	rec := &recorder{}
	tr, d := startCounted(t, Config{Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"slack": rec}, queue.ConsumerConfig{})
	publishJobs(t, tr, d.Queue(), periodJob(t, "n1", time.Second), periodJob(t, "n2", time.Second))
	// Handled at once, either may be the one sent first.
	if ids := sentIDs(t, tr, rec, 2); !slices.Equal(slices.Sorted(slices.Values(ids)), []string{"n1", "n2"}) {
		t.Errorf("sent %v, want one at once, then the other alone after the minPeriod", ids)
	}
}

// A job that gathered its firing and died before recording "digested" comes
// back once its claim expired, after the digest carrying it went out. It
// must not gather the firing again, nor send it alone.
func TestRedeliveredGatheredJobNotSentAgain(t *testing.T) {
	rec := &recorder{}
	tr, d := startCounted(t, Config{Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"slack": rec}, queue.ConsumerConfig{})
	n1, n2, n3 := periodJob(t, "n1", time.Second), periodJob(t, "n2", time.Second), periodJob(t, "n3", time.Second)
	publishJobs(t, tr, d.Queue(), n1, n2, n3)
	if ids := sentIDs(t, tr, rec, 2); len(ids) != 2 {
		t.Fatalf("sent %v, want one firing, then a digest of the other two", ids)
	}
	// The worker that gathered one of the digest's firings died before its
	// record: none is there.
	ctx := context.Background()
	var gathered *wire.Job
	for _, j := range []*wire.Job{&n1, &n2, &n3} {
		if d.rdb.Get(ctx, d.claimKey(j.Key())).Val() == "digested" {
			gathered = j
		}
	}
	if gathered == nil {
		t.Fatal("no firing recorded as digested")
	}
	if err := d.rdb.Del(ctx, d.claimKey(gathered.Key())).Err(); err != nil {
		t.Fatal(err)
	}
	publishJobs(t, tr, d.Queue(), *gathered) // its redelivery
	if ids := sentIDs(t, tr, rec, 2); len(ids) != 2 {
		t.Errorf("sent %v, want %s in one digest only", ids, gathered.Firings[0].Notification.ID)
	}
}

// newTestDeliverer is a deliverer on rdb that consumes nothing, its retry
// queues declared.
func newTestDeliverer(t *testing.T, prefix string, rdb redis.UniversalClient, pub Publisher, ch notify.Channel) *Deliverer {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return New(Config{Prefix: prefix, Limits: map[string][]pacing.Limit{},
		Redis: rdb, Publisher: pub, Channels: map[string]notify.Channel{"slack": ch}, Logger: log, Metrics: metrics.New(prometheus.NewRegistry())})
}

// Two flush jobs read the same digest in flight: one sends it, the other
// finds it sent before the first drops it. Both are done with it then, but
// one of them was the flush that what was gathered meanwhile counts on: it
// must not be left pending with no flush to come.
func TestFlushTakenByADigestInFlightStillFlushes(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	tr, base := startCounted(t, Config{Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"slack": rec}, queue.ConsumerConfig{})
	a := newTestDeliverer(t, base.cfg.Prefix, testenv.Redis(t), tr, rec)
	b := newTestDeliverer(t, base.cfg.Prefix, testenv.Redis(t), tr, rec)
	world := testenv.Redis(t)
	// The period is short: n2's digest comes a minPeriod after n1's was sent.
	flush := &wire.Job{Channel: "slack", Endpoint: "https://hooks.example/T1", MinPeriod: 1000, ProjectID: "p", RuleID: "r"}
	keys := a.minPeriodKeys(flush)
	pend := func(id string) {
		t.Helper()
		j := periodJob(t, id, time.Second)
		body, err := j.MarshalFlat()
		if err != nil {
			t.Fatal(err)
		}
		if err := world.HSet(ctx, keys.pending, id, body).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// n1's digest is in flight, its minPeriod over; n2 was gathered since,
	// its flush scheduled: that is the job b runs.
	pend("n1")
	if err := a.scripts.flush.Run(ctx, world, []string{keys.state, keys.pending, keys.inflight}, flush.MinPeriod).Err(); err != nil {
		t.Fatal(err)
	}
	pend("n2")
	world.HSet(ctx, keys.state, "last", 0, "sched", 1)

	// a sends n1's digest; b reads it and claims it between a's record and
	// a's drop.
	a.rdb.AddHook(&atScript{sha: a.scripts.drop.Hash(), then: func() {
		if err := b.deliverDigest(ctx, flush, "b"); err != nil {
			t.Error(err)
		}
	}})
	if err := a.deliverDigest(ctx, flush, "a"); err != nil {
		t.Fatal(err)
	}
	// A flush scheduled now would come from the shortest retry queue, to the
	// deliverer running on these queues.
	if ids := sentIDs(t, tr, rec, 2); !slices.Equal(ids, []string{"n1", "n2"}) {
		t.Errorf("sent %v, want n1's digest, then n2's: n2 is pending with no flush to come (state %v)",
			ids, world.HGetAll(ctx, keys.state).Val())
	}
}

// declaredDeliverer is a deliverer whose queues are declared, and that
// consumes none of them.
func declaredDeliverer(t *testing.T, cfg Config, channels map[string]notify.Channel) (*queue.Publisher, *Deliverer) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	pub, err := queue.NewPublisher(queue.PublisherConfig{URL: testenv.AMQPURL(t), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	cfg.Prefix = testenv.KeyPrefix(t)
	cfg.Redis, cfg.Publisher, cfg.Channels, cfg.Logger, cfg.Metrics = testenv.Redis(t), pub, channels, log, metrics.New(prometheus.NewRegistry())
	d := New(cfg)
	if err := d.Declare(context.Background(), pub); err != nil {
		t.Fatal(err)
	}
	names := []string{d.Queue(), d.cfg.BulkQueue, d.cfg.FailedQueue}
	for _, delay := range delays {
		names = append(names, d.delayQueue(delay))
	}
	testenv.DeleteQueuesAtCleanup(t, names...)
	return pub, d
}

func counterValue(t *testing.T, d *Deliverer, channel, outcome string) float64 {
	t.Helper()
	var m dto.Metric
	if err := d.metrics.Notifications.WithLabelValues(channel, outcome).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A retry of a digest that another flush job sent meanwhile finds it gone:
// what it flushes next is a new digest, with attempts of its own, not the
// ones left of the digest it was retrying.
func TestDigestRetryDoesNotSpendTheNextDigestsAttempts(t *testing.T) {
	ctx := context.Background()
	ch := &flaky{tried: make(chan struct{}, 16)}
	_, d := declaredDeliverer(t, Config{MaxAttempts: 2, Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"slack": ch})
	// The period is short: n2's digest comes a minPeriod after n1's was sent.
	flush := &wire.Job{Channel: "slack", Endpoint: "https://hooks.example/T1", MinPeriod: 1000, ProjectID: "p", RuleID: "r"}
	keys := d.minPeriodKeys(flush)
	pend := func(id string) {
		t.Helper()
		j := periodJob(t, id, time.Second)
		body, err := j.MarshalFlat()
		if err != nil {
			t.Fatal(err)
		}
		if err := d.rdb.HSet(ctx, keys.pending, id, body).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// n1's digest fails its first try: its retry is on the way.
	pend("n1")
	if err := d.deliverDigest(ctx, flush, "a"); err != nil {
		t.Fatal(err)
	}
	retry, err := wire.DecodeJob(takeOne(t, d.cfg.BulkQueue)) // retries come back in the bulk lane
	if err != nil {
		t.Fatal(err)
	}
	// Meanwhile another flush job sent n1's digest and dropped it; n2 was
	// gathered since, and is due.
	if err := d.record(ctx, d.claimKey("n1:slack:digest"), "sent"); err != nil {
		t.Fatal(err)
	}
	d.rdb.Del(ctx, keys.inflight)
	pend("n2")
	d.rdb.HSet(ctx, keys.state, "last", 0)

	if err := d.deliverDigest(ctx, &retry, "b"); err != nil {
		t.Fatal(err)
	}
	if v := counterValue(t, d, "slack", "failed"); v != 0 {
		t.Errorf("n2's digest failed for good after %d try: the retry of n1's spent its attempts", len(ch.times())-1)
	}
}

// slowFirst is a provider that takes its slow time to answer its first
// send; it notes when each message came and when its answer went.
type slowFirst struct {
	slow    time.Duration
	started chan struct{} // closed when the first message came
	mu      sync.Mutex
	came    []time.Time
	went    []time.Time
}

func (s *slowFirst) Notify(ctx context.Context, _ string, _ *notify.Message) (bool, error) {
	s.mu.Lock()
	first := len(s.came) == 0
	s.came = append(s.came, time.Now())
	s.mu.Unlock()
	if first {
		close(s.started)
		select {
		case <-time.After(s.slow): // the provider's slowness, not a wait for a condition
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.went = append(s.went, time.Now())
	return false, nil
}

// A message that took long to send starts its minPeriod when its send
// ended: the digest after it reaches the provider a whole minPeriod after
// the first message's answer, not a minPeriod after it passed the gate.
func TestMinPeriodRunsFromTheEndOfTheSend(t *testing.T) {
	const period = time.Second
	p := &slowFirst{slow: 600 * time.Millisecond, started: make(chan struct{})}
	pub, d := startDeliverer(t, Config{Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"slack": p})
	publishJobs(t, pub, d.Queue(), periodJob(t, "n1", period))
	select {
	case <-p.started:
	case <-time.After(20 * time.Second):
		t.Fatal("the first message never came")
	}
	publishJobs(t, pub, d.Queue(), periodJob(t, "n2", period))
	var n int
	if !testenv.Eventually(20*time.Second, func() bool { p.mu.Lock(); defer p.mu.Unlock(); n = len(p.came); return n == 2 }) {
		t.Fatalf("%d messages came, want the first and a digest", n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if gap := p.came[1].Sub(p.went[0]); gap < period {
		t.Errorf("digest came %s after the first message's answer, inside the minPeriod of %s", gap, period)
	}
}
