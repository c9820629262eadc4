package deliverer

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/notify/slack"
	"github.com/klaxonhq/klaxon/internal/notify/webhook"
	"github.com/klaxonhq/klaxon/internal/pacing"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// recorder is a provider that accepts everything and notes when.
type recorder struct {
	mu   sync.Mutex
	sent []time.Time
	ids  []string
}

func (r *recorder) Notify(_ context.Context, _ string, m *notify.Message) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, time.Now())
	r.ids = append(r.ids, m.ID)
	return false, nil
}

func (r *recorder) times() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.sent...)
}

// runDeliverer runs a deliverer with channel "slack" on queues of its own.
func runDeliverer(t *testing.T, ch notify.Channel) (*queue.Publisher, string) {
	t.Helper()
	pub, d := startDeliverer(t, Config{}, map[string]notify.Channel{"slack": ch})
	return pub, d.Queue()
}

// startDeliverer runs a deliverer with cfg (its prefix set for the test) and
// channels, on queues of its own.
func startDeliverer(t *testing.T, cfg Config, channels map[string]notify.Channel) (*queue.Publisher, *Deliverer) {
	t.Helper()
	return startDelivererWith(t, cfg, channels, queue.ConsumerConfig{})
}

// startDelivererWith is startDeliverer with the consumer configured as in
// cc (URL, queue and logger are filled in).
func startDelivererWith(t *testing.T, cfg Config, channels map[string]notify.Channel, cc queue.ConsumerConfig) (*queue.Publisher, *Deliverer) {
	t.Helper()
	tr, d := startCounted(t, cfg, channels, cc)
	return tr.Publisher, d
}

// startCounted is startDelivererWith with the jobs counted in and out
// (traffic), for a test that must know the deliverer idle.
func startCounted(t *testing.T, cfg Config, channels map[string]notify.Channel, cc queue.ConsumerConfig) (*traffic, *Deliverer) {
	t.Helper()
	url := testenv.AMQPURL(t)
	cfg.Prefix = testenv.KeyPrefix(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	pub, err := queue.NewPublisher(queue.PublisherConfig{URL: url, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	if cfg.Logger == nil {
		cfg.Logger = log
	}
	tr := &traffic{Publisher: pub}
	cfg.Redis, cfg.Publisher, cfg.Channels, cfg.Metrics = testenv.Redis(t), tr, channels, metrics.New(prometheus.NewRegistry())
	d := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	if err := d.Declare(ctx, pub); err != nil {
		t.Fatal(err)
	}
	names := []string{d.Queue(), d.cfg.BulkQueue, d.cfg.FailedQueue}
	for _, delay := range delays {
		names = append(names, d.delayQueue(delay))
	}
	testenv.DeleteQueuesAtCleanup(t, names...)
	tr.consumed = map[string]bool{}
	for _, q := range names {
		tr.consumed[q] = q != d.cfg.FailedQueue
	}
	settled := cc.Hooks.Batch
	cc.Hooks.Batch = func(r queue.BatchResult) {
		tr.settled.Add(int64(r.Acked))
		if settled != nil {
			settled(r)
		}
	}
	var wg sync.WaitGroup
	for _, q := range []string{d.Queue(), d.cfg.BulkQueue} {
		cc.URL, cc.Queue, cc.Logger = url, q, log
		c, err := queue.NewConsumer(cc)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { c.Consume(ctx, d.Handle) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return tr, d
}

// traffic is a test deliverer's publisher, shared with the test, that
// counts the jobs published to the queues the deliverer consumes (directly
// or through its retry queues): the test's, and the deliverer's own
// retries and flushes. Its consumers count the jobs they settle. When the
// counts meet, no job is queued or in hand, and nothing more is sent until
// the test publishes again. A job is counted before it is published: one
// whose publish failed keeps the deliverer from looking idle, never the
// reverse.
type traffic struct {
	*queue.Publisher
	consumed map[string]bool // by queue name; read-only once the deliverer runs
	queued   atomic.Int64
	settled  atomic.Int64
}

func (tr *traffic) Publish(ctx context.Context, msgs ...queue.Message) error {
	for _, m := range msgs {
		if tr.consumed[m.RoutingKey] {
			tr.queued.Add(1)
		}
	}
	return tr.Publisher.Publish(ctx, msgs...)
}

// waitIdle waits until every job published to the deliverer was settled.
func (tr *traffic) waitIdle(t *testing.T) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, "the deliverer to settle every job published to it", func() bool {
		return tr.settled.Load() == tr.queued.Load()
	})
}

// oneFiring is the job of firing n of rule, of project "p", on a
// channel's endpoint, with the rule's minPeriod there.
func oneFiring(channel, endpoint, rule string, minPeriod time.Duration, n *notify.Notification) wire.Job {
	return wire.Job{Kind: wire.KindFirings, Channel: channel, Endpoint: endpoint, ProjectID: "p",
		Firings: []wire.Firing{{RuleID: rule, MinPeriod: minPeriod.Milliseconds(), Notification: n}}}
}

func job(t *testing.T, id string) queue.Message {
	t.Helper()
	body, err := json.Marshal(oneFiring("slack", "https://hooks.example/T1", "r", 0,
		&notify.Notification{ID: id, Type: notify.TypeNew, FiredAt: time.Now()}))
	if err != nil {
		t.Fatal(err)
	}
	return queue.Message{Body: body}
}

// Three firings for one Slack webhook go out a second apart, none dropped;
// a duplicate job is sent once.
func TestPacedToTheProvidersLimit(t *testing.T) {
	rec := &recorder{}
	pub, q := runDeliverer(t, rec)
	var msgs []queue.Message
	for _, id := range []string{"n1", "n2", "n3", "n1"} {
		m := job(t, id)
		m.RoutingKey = q
		msgs = append(msgs, m)
	}
	if err := pub.Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(20*time.Second, func() bool { return len(rec.times()) >= 3 }) {
		t.Fatalf("%d of 3 notifications sent", len(rec.times()))
	}
	sent := rec.times()
	for i := 1; i < len(sent); i++ {
		// One a second per destination, measured where the provider is; a
		// few ms of scheduling between Redis' decision and the send.
		if gap := sent[i].Sub(sent[i-1]); gap < 950*time.Millisecond {
			t.Errorf("send %d came %v after the previous, want about a second or more", i, gap)
		}
	}
	rec.mu.Lock()
	ids := map[string]int{}
	for _, id := range rec.ids {
		ids[id]++
	}
	rec.mu.Unlock()
	if len(ids) != 3 || ids["n1"] != 1 {
		t.Errorf("sent %v, want n1, n2, n3 once each", ids)
	}
}

func TestPickDelay(t *testing.T) {
	for _, tc := range []struct {
		d       time.Duration
		atLeast bool
		want    time.Duration
	}{
		{0, true, 100 * time.Millisecond},
		{700 * time.Millisecond, true, time.Second},
		{2 * time.Second, true, 2 * time.Second},
		{time.Hour, true, 512 * time.Second},
		{700 * time.Millisecond, false, 500 * time.Millisecond},
		{33 * time.Second, false, 32 * time.Second},
		{10 * time.Millisecond, false, 100 * time.Millisecond},
	} {
		if got := pickDelay(tc.d, tc.atLeast); got != tc.want {
			t.Errorf("pickDelay(%v, %v) = %v, want %v", tc.d, tc.atLeast, got, tc.want)
		}
	}
	for n := 1; n <= 20; n++ {
		base := time.Second << min(n-1, 9)
		if got := backoff(n); got != base && got != base/2 {
			t.Errorf("backoff(%d) = %v, want %v or half", n, got, base)
		}
	}
}

func TestDigestIDFollowsContent(t *testing.T) {
	j := &wire.Job{ProjectID: "p", RuleID: "r"}
	a := digestMessage(j, []notify.Notification{{ID: "x"}, {ID: "y"}}, 0)
	b := digestMessage(j, []notify.Notification{{ID: "x"}, {ID: "y"}}, 0)
	c := digestMessage(j, []notify.Notification{{ID: "x"}, {ID: "z"}}, 0)
	one := digestMessage(j, []notify.Notification{{ID: "x"}}, 0)
	if a.ID != b.ID || a.ID == c.ID || !a.Digest {
		t.Errorf("digest ids %s %s %s: want equal for equal content, else distinct", a.ID, b.ID, c.ID)
	}
	if one.ID != "x" || one.Digest {
		t.Errorf("a digest of one is that notification: got %+v", one)
	}
}

// flaky is a provider that refuses every message as retryable, saying to
// come back after retryAfter, and notes when each try came.
type flaky struct {
	recorder
	retryAfter time.Duration
	tried      chan struct{} // gets a value per try
}

func (f *flaky) Notify(ctx context.Context, endpoint string, m *notify.Message) (bool, error) {
	_, _ = f.recorder.Notify(ctx, endpoint, m)
	f.tried <- struct{}{}
	return true, notify.WithRetryAfter(errors.New("503 Service Unavailable"), f.retryAfter)
}

// A short Retry-After, answered again and again, must not replace the
// exponential backoff: the tries would follow each other every
// Retry-After, and MaxAttempts would be spent in a second or two, so a
// provider down for a minute would lose the notification for good.
func TestShortRetryAfterKeepsTheBackoff(t *testing.T) {
	ch := &flaky{retryAfter: 100 * time.Millisecond, tried: make(chan struct{}, 16)}
	// No pacing, so that only the retry delay spaces the tries.
	pub, d := startDeliverer(t, Config{Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"webhook": ch})
	q := d.Queue()
	body, err := json.Marshal(oneFiring("webhook", "https://hooks.example/T1", "r", 0,
		&notify.Notification{ID: "n1", Type: notify.TypeNew, FiredAt: time.Now()}))
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), queue.Message{RoutingKey: q, Body: body}); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(20 * time.Second)
	for i := range 3 {
		select {
		case <-ch.tried:
		case <-timeout:
			t.Fatalf("%d of 3 tries made", i)
		}
	}
	sent := ch.times()
	for n := 1; n < len(sent); n++ {
		// The wait before retry n is backoff(n): 1 s << (n-1), or half.
		least := (time.Second << (n - 1)) / 2
		if gap := sent[n].Sub(sent[n-1]); gap < least*9/10 {
			t.Errorf("retry %d came %v after the previous try, want at least %v", n, gap, least)
		}
	}
}

// A Retry-After longer than the longest retry queue is honoured all the
// same: a job that comes back from that queue before the time is parked
// again, without a try that would be refused and spend an attempt.
func TestLongRetryAfterIsHonoured(t *testing.T) {
	ch := &flaky{retryAfter: time.Hour, tried: make(chan struct{}, 16)}
	pub, d := startDeliverer(t, Config{Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"webhook": ch})
	body, err := json.Marshal(oneFiring("webhook", "https://hooks.example/T1", "r", 0,
		&notify.Notification{ID: "n1", Type: notify.TypeNew, FiredAt: time.Now()}))
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), queue.Message{RoutingKey: d.Queue(), Body: body}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch.tried:
	case <-time.After(10 * time.Second):
		t.Fatal("no first try")
	}
	// Take the retry from the longest retry queue at once, and hand it back
	// as if its 512 s were up: an hour early.
	longest := d.delayQueue(delays[len(delays)-1])
	retry := takeOne(t, longest)
	if err := pub.Publish(context.Background(), queue.Message{RoutingKey: d.Queue(), Body: retry}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the early job parked again", func() bool {
		select {
		case <-ch.tried:
			t.Fatal("retried an hour before the provider's Retry-After")
		default:
		}
		n, err := pub.Depth(context.Background(), longest)
		return err == nil && n == 1
	})
	select {
	case <-ch.tried:
		t.Fatal("retried an hour before the provider's Retry-After")
	default:
	}
}

// takeOne consumes one message from queue name and returns its body.
func takeOne(t *testing.T, name string) []byte {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := queue.NewConsumer(queue.ConsumerConfig{URL: testenv.AMQPURL(t), Queue: name, Prefetch: 1, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var body []byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Consume(ctx, func(_ context.Context, b *queue.Batch) error {
			if body == nil {
				body = b.Deliveries[0].Body
				cancel()
			} else {
				b.Requeue(0)
			}
			return nil
		})
	}()
	<-done
	if body == nil {
		t.Fatalf("nothing came from %s", name)
	}
	return body
}

// A worker slow to learn that its digest went out meanwhile must not drop
// the next digest from flight: a retry or a crash of that digest's sender
// relies on finding it there.
func TestSettledDigestLeavesTheNextInFlight(t *testing.T) {
	ctx := context.Background()
	rdb, world := testenv.Redis(t), testenv.Redis(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d := New(Config{Prefix: testenv.KeyPrefix(t),
		Redis: rdb, Publisher: nil, Channels: map[string]notify.Channel{"slack": &recorder{}}, Logger: log, Metrics: metrics.New(prometheus.NewRegistry())})
	flush := &wire.Job{Channel: "slack", Endpoint: "https://hooks.example/T1", MinPeriod: 60_000, ProjectID: "p", RuleID: "r"}
	keys := d.minPeriodKeys(flush)
	pend := func(id string) {
		t.Helper()
		j := oneFiring("slack", "", "r", 0, &notify.Notification{ID: id, Type: notify.TypeNew, FiredAt: time.Now()})
		body, err := j.MarshalFlat()
		if err != nil {
			t.Fatal(err)
		}
		if err := world.HSet(ctx, keys.pending, id, body).Err(); err != nil {
			t.Fatal(err)
		}
	}
	pend("n1")
	// Another worker has sent n1's digest already.
	if err := d.record(ctx, d.claimKey("n1:slack:digest"), "sent"); err != nil {
		t.Fatal(err)
	}
	// Between this worker's flush (which reads n1's digest) and its claim,
	// that worker drops n1's digest and, a minPeriod later, flushes n2's.
	rdb.AddHook(&atScript{sha: d.scripts.flush.Hash(), after: true, then: func() {
		world.Del(ctx, keys.inflight)
		pend("n2")
		world.HSet(ctx, keys.state, "last", 0)
		if err := d.scripts.flush.Run(ctx, world, []string{keys.state, keys.pending, keys.inflight}, flush.MinPeriod).Err(); err != nil {
			t.Error(err)
		}
	}})
	if err := d.deliverDigest(ctx, flush, "token"); err != nil {
		t.Fatal(err)
	}
	if ids := world.HKeys(ctx, keys.inflight).Val(); !slices.Contains(ids, "n2") {
		t.Fatalf("in flight after settling n1's digest: %v, want n2's digest still there", ids)
	}

	// Once n2's digest is settled too, its own worker drops it.
	if err := d.record(ctx, d.claimKey("n2:slack:digest"), "sent"); err != nil {
		t.Fatal(err)
	}
	if err := d.deliverDigest(ctx, flush, "token"); err != nil {
		t.Fatal(err)
	}
	if n := world.Exists(ctx, keys.inflight).Val(); n != 0 {
		t.Errorf("n2's digest still in flight after it was settled")
	}
}

// atScript runs then once at a chosen moment of a Redis client's traffic:
// just before the script sha runs, or, with after, between that script and
// the next command or pipeline (between a digest's flush and its claim).
// Tests interleave two workers there, deterministically.
type atScript struct {
	sha   string
	after bool
	then  func()
	state atomic.Int32 // 0 waiting for the script, 1 armed (after), 2 done
}

func (h *atScript) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *atScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.fireIfArmed()
		script := h.runs(cmd)
		if script && !h.after && h.state.CompareAndSwap(0, 2) {
			h.then()
		}
		err := next(ctx, cmd)
		// Only once it ran: an EVALSHA answered NOSCRIPT is followed by
		// the EVAL of the same script, which must not find the moment
		// already past.
		if script && h.after && err == nil {
			h.state.CompareAndSwap(0, 1)
		}
		return err
	}
}

// runs reports whether cmd runs the script, by EVALSHA or by EVAL.
func (h *atScript) runs(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	body, _ := args[1].(string)
	sum := sha1.Sum([]byte(body))
	return body == h.sha || hex.EncodeToString(sum[:]) == h.sha
}

func (h *atScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.fireIfArmed()
		return next(ctx, cmds)
	}
}

func (h *atScript) fireIfArmed() {
	if h.state.CompareAndSwap(1, 2) {
		h.then()
	}
}

// A webhook endpoint that takes requests and never answers must not delay
// the notifications behind its jobs: another channel's, and another
// webhook's. The consumer is configured as cmd/worker configures the
// deliverer's: prefetch 64, jobs handled and acked one by one, 64 at once.
// Handled a batch at a time, the Slack message would wait for the hung
// sends' timeout (a minute here).
func TestHungEndpointDoesNotDelayOtherNotifications(t *testing.T) {
	var arrived atomic.Int64
	arrivals := make(chan struct{}, 16)
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		arrivals <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hung.Close)
	slackFake := notifytest.NewSlackServer(t)
	sink := notifytest.NewWebhookSink(t)

	client := &http.Client{}
	pub, d := startDelivererWith(t,
		Config{SendTimeout: time.Minute, Limits: map[string][]pacing.Limit{}},
		map[string]notify.Channel{"webhook": webhook.New(client), "slack": slack.New(client)},
		queue.ConsumerConfig{Prefetch: 64, MaxBatch: 1, Concurrency: 64})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the deliverer stops, should the test fail first

	jobTo := func(channel, endpoint, id string) queue.Message {
		t.Helper()
		body, err := json.Marshal(oneFiring(channel, endpoint, "r", 0, new(notifytest.Threshold(id, "Hung provider "+id, time.Now()))))
		if err != nil {
			t.Fatal(err)
		}
		return queue.Message{RoutingKey: d.Queue(), Body: body, MessageID: id, ContentType: "application/json"}
	}
	ctx := context.Background()
	const hungJobs = 2
	for i := range hungJobs {
		if err := pub.Publish(ctx, jobTo("webhook", hung.URL+"/hook", fmt.Sprintf("hung%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for range hungJobs {
		select {
		case <-arrivals:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d requests reached the hung endpoint", arrived.Load(), hungJobs)
		}
	}

	// Both hung sends are under way, for a minute; the next jobs come after.
	start := time.Now()
	if err := pub.Publish(ctx, jobTo("slack", slackFake.URL, "s1"), jobTo("webhook", sink.URL, "w1")); err != nil {
		t.Fatal(err)
	}
	if _, err := slackFake.WaitFor(1, 5*time.Second); err != nil {
		t.Fatalf("Slack message held up behind the hung webhook: %v", err)
	}
	if _, err := sink.WaitFor(1, 5*time.Second); err != nil {
		t.Fatalf("webhook to a healthy endpoint held up behind the hung one: %v", err)
	}
	t.Logf("both sent %s after being queued, the hung sends still waiting", time.Since(start).Round(time.Millisecond))
	if n := arrived.Load(); n != hungJobs {
		t.Errorf("%d requests to the hung endpoint, want %d", n, hungJobs)
	}

	// Once the endpoint answers, its jobs are done too, each sent once.
	free()
	sent := func(channel string) float64 {
		var m dto.Metric
		if err := d.metrics.Notifications.WithLabelValues(channel, "sent").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	if !testenv.Eventually(10*time.Second, func() bool { return sent("webhook") >= hungJobs+1 }) {
		t.Fatalf("%v webhook notifications sent, want %d", sent("webhook"), hungJobs+1)
	}
	if v := sent("slack"); v != 1 {
		t.Errorf("%v Slack notifications sent, want 1", v)
	}
}

// With WaitReplicas, a claim or a record that no replica acknowledged
// fails, so that the job is held and tried again rather than sent on a
// claim, or acked on a record, that a Sentinel failover could lose; the
// test's Redis has no replica.
func TestWaitReplicasFailsClaimsAndRecordsWithoutReplicas(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rdb, cmds := testenv.Redis(t), &commands{}
	rdb.AddHook(cmds)
	prefix := testenv.KeyPrefix(t)
	d := New(Config{Prefix: prefix, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond,
		Redis: rdb, Publisher: nil, Channels: map[string]notify.Channel{"slack": &recorder{}}, Logger: log, Metrics: metrics.New(prometheus.NewRegistry())})
	key := d.claimKey("n1:slack")
	if _, _, err := d.claim(ctx, key, "c:token"); err == nil || !strings.Contains(err.Error(), "0 of 1 replicas") {
		t.Errorf("claim without replicas: %v, want an error saying no replica acknowledged", err)
	}
	if err := d.record(ctx, key, "sent"); err == nil || !strings.Contains(err.Error(), "0 of 1 replicas") {
		t.Errorf("record without replicas: %v, want an error saying no replica acknowledged", err)
	}
	// The writes themselves were made: a retry finds its own claim.
	if v := testenv.Redis(t).Get(ctx, key).Val(); v != "sent" {
		t.Errorf("%s = %q, want the record written", key, v)
	}
	// WAIT covers what its own connection wrote: a record that was there
	// already (written by another connection) would pass it at once. Each
	// WAIT follows a write of its own.
	waits := 0
	for i, c := range cmds.names {
		if c == "wait" {
			waits++
			if i == 0 || cmds.names[i-1] != "set "+prefix+":wait" {
				t.Errorf("commands %v: WAIT at %d without a write of its own just before", cmds.names, i)
			}
		}
	}
	if waits != 2 {
		t.Errorf("%d WAITs, want one for the claim and one for the record", waits)
	}
}

// commands records the names of the commands a client sends one by one.
type commands struct{ names []string }

func (c *commands) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if name == "set" {
			name += " " + fmt.Sprint(cmd.Args()[1])
		}
		c.names = append(c.names, name)
		return next(ctx, cmd)
	}
}
func (c *commands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A send whose record Redis refused is kept in memory and recorded at the
// job's next try; a worker that stops first records it on its way out
// (Flush), or says how many it could not.
func TestFlushRecordsOutcomesKeptInMemory(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	prefix := testenv.KeyPrefix(t)
	cfg := Config{Prefix: prefix, Channels: map[string]notify.Channel{"slack": &recorder{}}, Logger: log,
		Metrics: metrics.New(prometheus.NewRegistry())}

	// Redis down: nothing can be recorded before the deadline.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close() // nothing listens there now
	down := redis.NewClient(&redis.Options{Addr: closed, MaxRetries: -1})
	t.Cleanup(func() { down.Close() })
	cfg.Redis = down
	d := New(cfg)
	keys := []string{d.claimKey("n1:slack"), d.claimKey("n2:slack")}
	d.remember(keys, "sent")
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := d.Flush(dctx); err == nil || !strings.Contains(err.Error(), "2 notification outcomes left unrecorded") {
		t.Fatalf("Flush with Redis down: %v, want an error counting 2 outcomes left", err)
	}

	// Redis back: both are recorded, and nothing is left to flush.
	rdb := testenv.Redis(t)
	d.rdb = rdb
	if err := d.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	for _, k := range keys {
		if v := rdb.Get(ctx, k).Val(); v != "sent" {
			t.Errorf("%s = %q, want sent", k, v)
		}
	}
	left := 0
	d.unrecorded.Range(func(any, any) bool { left++; return true })
	if left != 0 {
		t.Errorf("%d outcomes still kept after Flush", left)
	}
}

// A notification costs the deliverer two Redis round trips on a single
// node: its claim, which reads the rule's snoozes in the same
// transaction, and its record once sent.
func TestANotificationCostsTwoRedisRoundTrips(t *testing.T) {
	rec := &recorder{}
	pub, d := startDeliverer(t, Config{Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"slack": rec})
	trips := &roundTrips{}
	d.rdb.AddHook(trips)
	m := job(t, "n1")
	m.RoutingKey = d.Queue()
	if err := pub.Publish(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	key := d.claimKey("n1:slack")
	world := testenv.Redis(t) // polls on a client of its own, not counted
	if !testenv.Eventually(10*time.Second, func() bool { return world.Get(context.Background(), key).Val() == "sent" }) {
		t.Fatalf("n1 not recorded as sent; %d sends", len(rec.times()))
	}
	if got := trips.n.Load(); got != 2 {
		t.Errorf("%d round trips for one notification, want 2: the claim with the snooze read, and the record", got)
	}
}

// roundTrips counts a client's round trips: a command sent alone, or a
// pipeline or transaction; not what opens a connection (HELLO, CLIENT
// SETINFO), which a pool does once per connection.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name != "hello" && name != "client" {
			r.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() != "client" {
			r.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// "notification sent" is logged once the send is recorded in Redis, and
// says so: tools/chaos reads the line to tell a repeat caused by a crash
// between send and record from a record that was lost.
func TestSentIsLoggedOnceRecorded(t *testing.T) {
	h := &sentLines{rdb: testenv.Redis(t)}
	pub, d := startDeliverer(t, Config{Logger: slog.New(h)}, map[string]notify.Channel{"slack": &recorder{}})
	h.mu.Lock()
	h.key = d.claimKey(wire.FiringKey("n1", "slack"))
	h.mu.Unlock()
	m := job(t, "n1")
	m.RoutingKey = d.Queue()
	if err := pub.Publish(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, `a "notification sent" line`, func() bool { return len(h.lines()) > 0 })
	if got := h.lines(); len(got) != 1 || got[0] != "recorded=true, claim holds sent" {
		t.Errorf("lines %q, want one saying recorded=true while the claim holds sent", got)
	}
}

// sentLines notes, for each "notification sent" line, its recorded
// attribute and what the claim key held when it was logged.
type sentLines struct {
	rdb redis.UniversalClient
	mu  sync.Mutex
	key string
	got []string
}

func (h *sentLines) Enabled(context.Context, slog.Level) bool { return true }
func (h *sentLines) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *sentLines) WithGroup(string) slog.Handler            { return h }

func (h *sentLines) Handle(ctx context.Context, r slog.Record) error {
	if r.Message != "notification sent" {
		return nil
	}
	recorded := "missing"
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "recorded" {
			recorded = a.Value.String()
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	state, _ := h.rdb.Get(ctx, h.key).Result()
	h.got = append(h.got, fmt.Sprintf("recorded=%s, claim holds %s", recorded, state))
	return nil
}

func (h *sentLines) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}
