package storm_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/seal"
	"github.com/klaxonhq/klaxon/internal/storm"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

const project = "5e3eef0679fa3700a0198a49"

type staticRules struct{ m *rules.Matcher }

func (s staticRules) Matcher(string) *rules.Matcher { return s.m }
func (s staticRules) Ready() bool                   { return true }

// setup is a counter, a rule asking for storm-over messages on two
// channels, and a confirmed publisher to a queue of the test's own.
type setup struct {
	t      *testing.T
	rdb    redis.UniversalClient
	prefix string
	engine *counter.Engine
	rule   *rules.Rule
	pub    *queue.Publisher
	amqp   string
	queue  string
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	s := &setup{t: t, rdb: testenv.Redis(t), prefix: testenv.KeyPrefix(t), amqp: testenv.AMQPURL(t), queue: testenv.QueueName(t)}
	s.engine = counter.New(s.rdb, counter.Options{Prefix: s.prefix})
	on := true
	r, _, err := rules.Compile(project, rules.Spec{ID: "storm-rule", IsEnabled: true, WhatToReceive: rules.SeenMore,
		Windows: []rules.WindowSpec{{Threshold: 5, Period: 1000}}, StormOver: &on,
		Channels: map[string]rules.ChannelSpec{
			"webhook": {IsEnabled: true, Endpoint: "https://example.com/hook"},
			"slack":   {IsEnabled: true, Endpoint: "https://hooks.slack.com/services/T/B/x"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	s.rule = r
	pub, err := queue.NewPublisher(queue.PublisherConfig{URL: s.amqp, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	s.pub = pub
	testenv.DeleteQueuesAtCleanup(t, s.queue)
	if err := pub.Declare(context.Background(), s.queue, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

// onCluster moves the setup to a Redis Cluster of the test's own.
func (s *setup) onCluster() {
	s.rdb = testenv.Cluster(s.t)
	s.engine = counter.New(s.rdb, counter.Options{Prefix: s.prefix})
}

func (s *setup) tracker(pub storm.Publisher, lease time.Duration) *storm.Tracker {
	return storm.New(storm.Config{Redis: s.rdb, Prefix: s.prefix, Rings: s.engine, Rules: staticRules{rules.NewMatcher([]*rules.Rule{s.rule})},
		Publisher: pub, DeliveryQueue: s.queue, Poll: 20 * time.Millisecond, Lease: lease,
		Metrics: metrics.New(prometheus.NewRegistry())})
}

// storm counts n events of a group, one every 100 ms from a whole 100 ms
// ten seconds ago, and returns the firing they caused.
func (s *setup) storm(group string, n int) (counter.Outcome, time.Time) {
	s.t.Helper()
	ctx := context.Background()
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	base := now.Add(-10 * time.Second).Truncate(100 * time.Millisecond)
	var events []counter.Event
	for i := range n {
		events = append(events, counter.Event{ProjectID: project, GroupHash: group, Time: base.Add(time.Duration(i) * 100 * time.Millisecond),
			Rules: []*rules.Rule{s.rule}})
	}
	res, err := s.engine.ObserveBatch(ctx, time.Now().UnixNano(), events)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, r := range res {
		if len(r.Outcomes) > 0 && r.Outcomes[0].Fired {
			return r.Outcomes[0], base
		}
	}
	s.t.Fatal("the events did not fire")
	return counter.Outcome{}, base
}

func firing(o counter.Outcome, group string) *notify.Notification {
	return &notify.Notification{ID: o.ID, Type: notify.TypeThreshold, ProjectID: project, RuleID: o.Rule.ID,
		Event: notify.Event{Title: "DatabaseError", GroupHash: group}, Count: o.Counts[o.Window], FiredAt: o.At}
}

// wait runs trackers until no storm is left, then returns the jobs
// published.
func (s *setup) wait(trackers ...*storm.Tracker) []amqp.Delivery {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, tr := range trackers {
		wg.Go(func() { _ = tr.Run(ctx) })
	}
	testenv.WaitFor(s.t, 30*time.Second, "every storm over", func() bool { return s.rdb.ZCard(ctx, s.prefix+":{storms}:due").Val() == 0 })
	cancel()
	wg.Wait()
	return s.jobs()
}

func (s *setup) jobs() []amqp.Delivery {
	conn, err := amqp.Dial(s.amqp)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		s.t.Fatal(err)
	}
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(s.queue, true)
		if err != nil {
			s.t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// checkOver checks that jobs are the storm's one message on each channel.
func checkOver(t *testing.T, jobs []amqp.Delivery, firingID string, events, duration int64) {
	t.Helper()
	want := storm.OverID(firingID)
	seen := map[string]int{}
	for _, d := range jobs {
		j, err := wire.DecodeJob(d.Body)
		if err != nil {
			t.Fatal(err)
		}
		n := j.Firings[0].Notification
		seen[d.MessageId]++
		if n.ID != want || d.MessageId != j.Key() || n.Type != notify.TypeStormOver || n.Storm == nil ||
			n.Storm.FiringID != firingID || n.Storm.Events != events || n.Storm.Duration != duration || !n.Storm.Exact {
			b, _ := json.Marshal(n)
			t.Errorf("job %s: %s; want id %s, %d events in %d ms", d.MessageId, b, want, events, duration)
		}
	}
	if len(seen) != 2 || seen[want+":webhook"] != 1 || seen[want+":slack"] != 1 {
		t.Fatalf("jobs %v: want one on webhook and one on slack", seen)
	}
}

func TestTwoTrackersRacingPublishOneMessagePerChannel(t *testing.T) {
	s := newSetup(t)
	o, _ := s.storm("g1", 6)
	a, b := s.tracker(s.pub, time.Minute), s.tracker(s.pub, time.Minute)
	if err := a.Start(context.Background(), s.rule, 0, firing(o, "g1")); err != nil {
		t.Fatal(err)
	}
	// The 5th event fired at +400 ms; the window fell below 5 when the
	// second bucket left it, at +1,200 ms: 800 ms, 6 events.
	checkOver(t, s.wait(a, b), o.ID, 6, 800)
}

func TestReplayedFiringStartsNoSecondStorm(t *testing.T) {
	s := newSetup(t)
	o, _ := s.storm("g2", 6)
	a := s.tracker(s.pub, time.Minute)
	if err := a.Start(context.Background(), s.rule, 0, firing(o, "g2")); err != nil {
		t.Fatal(err)
	}
	checkOver(t, s.wait(a), o.ID, 6, 800)
	// The message that fired comes back (a redelivery): its firing is
	// replayed, and the storm it started is over.
	if err := a.Start(context.Background(), s.rule, 0, firing(o, "g2")); err != nil {
		t.Fatal(err)
	}
	if jobs := s.wait(a); len(jobs) != 0 {
		t.Fatalf("%d more jobs after a replayed firing", len(jobs))
	}
}

// dies is a publisher whose worker is killed: before its jobs reach the
// broker, or after, before it could record that they did.
type dies struct {
	pub   storm.Publisher
	after bool
	calls int
	err   error // of the publish before dying
}

func (d *dies) Publish(ctx context.Context, msgs ...queue.Message) error {
	d.calls++
	if d.after {
		// The worker dies once its jobs are out: a check that ran past its
		// timeout on a slow machine must not leave them unpublished.
		d.err = d.pub.Publish(context.WithoutCancel(ctx), msgs...)
	}
	return errors.New("killed")
}

func TestWorkerKilledBeforePublishingLeavesOneMessage(t *testing.T) {
	s := newSetup(t)
	o, _ := s.storm("g3", 6)
	killed := &dies{pub: s.pub}
	a := s.tracker(killed, 300*time.Millisecond)
	if err := a.Start(context.Background(), s.rule, 0, firing(o, "g3")); err != nil {
		t.Fatal(err)
	}
	for killed.calls == 0 {
		_ = a.Sweep(context.Background()) // until it decided, and died publishing
	}
	// Another worker takes the storm once the dead one's lease ends.
	checkOver(t, s.wait(s.tracker(s.pub, time.Minute)), o.ID, 6, 800)
}

func TestWorkerKilledAfterPublishingRepeatsTheSameJobs(t *testing.T) {
	s := newSetup(t)
	o, _ := s.storm("g4", 6)
	killed := &dies{pub: s.pub, after: true}
	a := s.tracker(killed, 300*time.Millisecond)
	if err := a.Start(context.Background(), s.rule, 0, firing(o, "g4")); err != nil {
		t.Fatal(err)
	}
	for killed.calls == 0 {
		_ = a.Sweep(context.Background())
	}
	if killed.err != nil {
		t.Fatalf("publish before dying: %v", killed.err)
	}
	jobs := s.wait(s.tracker(s.pub, time.Minute))
	// The jobs are published twice with the same keys: the deliverer
	// claims each key once (cmd/worker's e2e test sends through it).
	if len(jobs) != 4 {
		t.Fatalf("%d jobs, want the two published twice", len(jobs))
	}
	checkOver(t, jobs[:2], o.ID, 6, 800)
	checkOver(t, jobs[2:], o.ID, 6, 800)
}

func TestFiringDuringAStormJoinsIt(t *testing.T) {
	s := newSetup(t)
	o, _ := s.storm("g5", 6)
	a := s.tracker(s.pub, time.Minute)
	if err := a.Start(context.Background(), s.rule, 0, firing(o, "g5")); err != nil {
		t.Fatal(err)
	}
	later := firing(o, "g5")
	later.ID = "another-firing-of-the-same-storm"
	if err := a.Start(context.Background(), s.rule, 0, later); err != nil {
		t.Fatal(err)
	}
	checkOver(t, s.wait(a), o.ID, 6, 800)
}

// racingRings is a ring reader that, once armed, lets something happen
// (a firing counted and told) just after a check read the ring: the
// check then decides on what it read before.
type racingRings struct {
	engine *counter.Engine
	then   func()
}

func (r *racingRings) Ring(ctx context.Context, projectID, groupHash string, rule *rules.Rule, w int) (counter.Ring, error) {
	ring, err := r.engine.Ring(ctx, projectID, groupHash, rule, w)
	if then := r.then; then != nil {
		r.then = nil
		then()
	}
	return ring, err
}

func TestFiringAsTheStormEndsKeepsItGoing(t *testing.T) {
	s := newSetup(t)
	o, _ := s.storm("g6", 6)
	rings := &racingRings{engine: s.engine}
	tr := storm.New(storm.Config{Redis: s.rdb, Prefix: s.prefix, Rings: rings, Rules: staticRules{rules.NewMatcher([]*rules.Rule{s.rule})},
		Publisher: s.pub, DeliveryQueue: s.queue, Poll: 20 * time.Millisecond, Metrics: metrics.New(prometheus.NewRegistry())})
	if err := tr.Start(context.Background(), s.rule, 0, firing(o, "g6")); err != nil {
		t.Fatal(err)
	}
	// The check reads a quiet ring; before it records the end, five new
	// events fire again, and the firing joins the storm.
	rings.then = func() {
		var events []counter.Event
		for range 5 {
			events = append(events, counter.Event{ProjectID: project, GroupHash: "g6", Rules: []*rules.Rule{s.rule}})
		}
		res, err := s.engine.ObserveBatch(context.Background(), time.Now().UnixNano(), events)
		if err != nil || !res[4].Outcomes[0].Fired {
			t.Errorf("the new events did not fire: %v", err)
			return
		}
		if err := tr.Start(context.Background(), s.rule, 0, firing(res[4].Outcomes[0], "g6")); err != nil {
			t.Error(err)
		}
	}
	jobs := s.wait(tr)
	if len(jobs) != 2 {
		t.Fatalf("%d jobs, want one storm-over message on each of 2 channels", len(jobs))
	}
	for _, d := range jobs {
		j, err := wire.DecodeJob(d.Body)
		if err != nil {
			t.Fatal(err)
		}
		if n := j.Firings[0].Notification; n.Storm.FiringID != o.ID || n.Storm.Events != 11 || n.ID != storm.OverID(o.ID) {
			t.Errorf("storm %+v: want the first firing's storm, with all 11 events", n.Storm)
		}
	}
}

// On Cluster every storm script touches one slot, whatever node the
// storm's group lives on.
func TestStormsOnCluster(t *testing.T) {
	s := newSetup(t)
	s.onCluster()
	a, b := s.tracker(s.pub, time.Minute), s.tracker(s.pub, time.Minute)
	var ids []string
	for _, g := range []string{"c1", "c2", "c3", "c4"} {
		o, _ := s.storm(g, 6)
		if err := a.Start(context.Background(), s.rule, 0, firing(o, g)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, storm.OverID(o.ID))
	}
	jobs := s.wait(a, b)
	if len(jobs) != 8 {
		t.Fatalf("%d jobs, want 4 storms on 2 channels", len(jobs))
	}
	seen := map[string]bool{}
	for _, d := range jobs {
		seen[d.MessageId] = true
	}
	for _, id := range ids {
		if !seen[id+":webhook"] || !seen[id+":slack"] {
			t.Errorf("no storm-over jobs for %s in %v", id, seen)
		}
	}
}

// With KLAXON_ENDPOINT_KEY, a decided storm's record in Redis and its jobs
// carry sealed endpoints, which the deliverer opens to the rule's own.
func TestEndpointsSealedInRecordAndJobs(t *testing.T) {
	s := newSetup(t)
	raw := make([]byte, seal.KeySize)
	rand.Read(raw)
	keys, err := seal.Parse(base64.StdEncoding.EncodeToString(raw))
	if err != nil {
		t.Fatal(err)
	}
	o, _ := s.storm("g-sealed", 6)
	tracker := func(pub storm.Publisher, lease time.Duration) *storm.Tracker {
		return storm.New(storm.Config{Redis: s.rdb, Prefix: s.prefix, Rings: s.engine, Rules: staticRules{rules.NewMatcher([]*rules.Rule{s.rule})},
			Publisher: pub, DeliveryQueue: s.queue, Keys: keys, Poll: 20 * time.Millisecond, Lease: lease,
			Metrics: metrics.New(prometheus.NewRegistry())})
	}
	killed := &dies{pub: s.pub}
	a := tracker(killed, 300*time.Millisecond)
	if err := a.Start(context.Background(), s.rule, 0, firing(o, "g-sealed")); err != nil {
		t.Fatal(err)
	}
	for killed.calls == 0 {
		_ = a.Sweep(context.Background()) // until it decided, and died publishing
	}
	// Decided, not published: the record holds the message and its channels.
	ctx := context.Background()
	var values []string
	for it := s.rdb.Scan(ctx, 0, s.prefix+"*", 100).Iterator(); it.Next(ctx); {
		switch s.rdb.Type(ctx, it.Val()).Val() {
		case "string":
			values = append(values, s.rdb.Get(ctx, it.Val()).Val())
		case "hash":
			for _, v := range s.rdb.HGetAll(ctx, it.Val()).Val() {
				values = append(values, v)
			}
		}
	}
	if !slices.ContainsFunc(values, func(v string) bool { return strings.Contains(v, "storm_over") }) {
		t.Fatal("no decided storm record found under the test's prefix")
	}
	for _, c := range s.rule.Channels {
		for _, v := range values {
			if strings.Contains(v, c.Endpoint) {
				t.Errorf("the %s endpoint is in clear in Redis", c.Name)
			}
		}
	}
	jobs := s.wait(tracker(s.pub, time.Minute))
	checkOver(t, jobs, o.ID, 6, 800)
	for _, d := range jobs {
		j, _ := wire.DecodeJob(d.Body)
		want := ""
		for _, c := range s.rule.Channels {
			if c.Name == j.Channel {
				want = c.Endpoint
			}
		}
		if !seal.Sealed(j.Endpoint) {
			t.Errorf("%s job's endpoint is not sealed", j.Channel)
		}
		if got, err := keys.Open(j.Endpoint, project, j.Channel); err != nil || got != want {
			t.Errorf("%s job's endpoint opens to %q, %v; want the rule's", j.Channel, got, err)
		}
	}
}
