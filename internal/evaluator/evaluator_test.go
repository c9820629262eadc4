package evaluator_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/wire"
)

const (
	project = "5e3eef0679fa3700a0198a49"
	other   = "5e3eef0679fa3700a0198a4a" // a project without rules
)

// fakeCounter records what it is asked and fires the rules named in fire.
type fakeCounter struct {
	calls  [][]counter.Event
	fire   map[string]bool // rule ids that fire at every event
	err    error
	reuse  []counter.Result
	record bool
	// hashIDs gives firings the counter's own ids, hashes of the rule id
	// among others, rather than "firing-<rule id>".
	hashIDs bool
}

func (f *fakeCounter) ObserveBatch(_ context.Context, _ int64, events []counter.Event) ([]counter.Result, error) {
	if f.err != nil {
		return nil, f.err
	}
	if f.record {
		cp := make([]counter.Event, len(events))
		copy(cp, events)
		f.calls = append(f.calls, cp)
	}
	if cap(f.reuse) < len(events) {
		f.reuse = make([]counter.Result, len(events))
	}
	res := f.reuse[:len(events)]
	for i := range events {
		ev := &events[i]
		if cap(res[i].Outcomes) < len(ev.Rules) {
			res[i].Outcomes = make([]counter.Outcome, len(ev.Rules))
		}
		res[i].Outcomes = res[i].Outcomes[:len(ev.Rules)]
		for k, r := range ev.Rules {
			o := counter.Outcome{Rule: r, Window: -1}
			if f.fire[r.ID] {
				o.Fired, o.ID, o.At, o.Window = true, "firing-"+r.ID, time.UnixMilli(1_700_000_000_000), 0
				o.Counts = make([]int64, len(r.Windows))
				if f.hashIDs {
					o.ID = counter.FiringID(ev.ProjectID, r.ID, ev.GroupHash, o.At)
				}
			}
			res[i].Outcomes[k] = o
		}
	}
	return res, nil
}

type fakePublisher struct{ msgs []queue.Message }

func (p *fakePublisher) Publish(_ context.Context, msgs ...queue.Message) error {
	p.msgs = append(p.msgs, msgs...)
	return nil
}

func value(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func compile(t testing.TB, projects map[string][]rules.Spec) *store.Snapshot {
	t.Helper()
	snap := store.Compile(store.Specs{Projects: projects}, time.Now())
	for _, p := range snap.Problems() {
		if p.Skipped {
			t.Fatalf("rule skipped: %v", p)
		}
	}
	return snap
}

func webhook() map[string]rules.ChannelSpec {
	return map[string]rules.ChannelSpec{rules.Webhook: {IsEnabled: true, Endpoint: "http://127.0.0.1:1/hook"}}
}

func newEvaluator(snap *store.Snapshot, c evaluator.Counter, p evaluator.Publisher) (*evaluator.Evaluator, *metrics.Metrics) {
	m := metrics.New(prometheus.NewRegistry())
	return &evaluator.Evaluator{
		Rules: snap, Counter: c, Publisher: p, DeadQueue: "events.dead", DeliveryQueue: "k.deliveries",
		Log: slog.New(slog.DiscardHandler), Metrics: m,
	}, m
}

func delivery(body string, id string) queue.Delivery {
	return queue.Delivery{Body: []byte(body), MessageID: id}
}

func hawk(projectID, title, group string, isNew bool) string {
	return fmt.Sprintf(`{"projectId":%q,"event":{"title":%q,"groupHash":%q,"isNew":%t,"repetitionId":null}}`, projectID, title, group, isNew)
}

func TestHandleRoutesEveryKindOfMessage(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "db", IsEnabled: true, WhatToReceive: rules.SeenMore, Including: []string{"Database"}, Threshold: 2, ThresholdPeriod: 60_000, Channels: webhook()},
		{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Excluding: []string{"STAGING"}, Channels: webhook()},
	}})
	fc := &fakeCounter{fire: map[string]bool{"new": true}, record: true}
	pub := &fakePublisher{}
	e, m := newEvaluator(snap, fc, pub)

	b := &queue.Batch{Deliveries: []queue.Delivery{
		delivery(hawk(project, "DATABASE down", "g1", false), "m1"),          // db
		delivery(`not json`, "m2"),                                           // dead
		delivery(hawk(other, "x", "g2", true), ""),                           // no rules
		delivery(hawk(project, "TypeError", "g3", false), ""),                // unmatched
		delivery(hawk(project, "database on Staging", "g4", true), ""),       // db only (new excluded)
		delivery(hawk(project, "TypeError: new one", "g5", true), "m6"),      // new: fires
		delivery(hawk(strings.ToUpper(project), "Database", "g6", true), ""), // both; upper-case project id
	}}
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if len(fc.calls) != 1 {
		t.Fatalf("%d counter calls, want 1", len(fc.calls))
	}
	evs := fc.calls[0]
	if got, want := counted(evs), "g1=db g4=db g5=new g6=db+new"; got != want {
		t.Errorf("counted %q, want %q", got, want)
	}
	if evs[0].ID != "id:m1" || evs[1].ID != "" {
		t.Errorf("event ids %q %q, want the message-id and none", evs[0].ID, evs[1].ID)
	}
	if evs[0].ProjectID != project || !evs[0].Time.IsZero() {
		t.Errorf("event 0 = %+v", evs[0])
	}

	var dead, jobs int
	for _, msg := range pub.msgs {
		switch msg.RoutingKey {
		case "events.dead":
			dead++
			if msg.Headers[wire.ErrorHeader] == nil || string(msg.Body) != "not json" {
				t.Errorf("dead letter %+v", msg)
			}
		case "k.deliveries":
			jobs++
			job, err := wire.DecodeJob(msg.Body)
			if err != nil {
				t.Fatal(err)
			}
			if f := job.Firings; len(f) != 1 || f[0].RuleID != "new" || f[0].Notification.Type != "new" || f[0].Notification.ID != "firing-new" {
				t.Errorf("job %+v", job)
			}
		}
	}
	if dead != 1 || jobs != 2 {
		t.Errorf("%d dead letters and %d jobs, want 1 and 2", dead, jobs)
	}
	for outcome, want := range map[string]float64{"counted": 4, "dead": 1, "no_rules": 1, "unmatched": 1} {
		if got := value(t, m.Events.WithLabelValues(outcome)); got != want {
			t.Errorf("events{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
}

// A message is named by its message-id, else by Hawk's repetitionId, else
// by nothing: identical bodies without either are distinct occurrences,
// and each counts (a producer that repeats its body must not be counted
// once per de-duplication period, which silences its alerts).
func TestHandleIdentity(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "all", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 10, ThresholdPeriod: 60_000, Channels: webhook()},
	}})
	fc := &fakeCounter{record: true}
	e, _ := newEvaluator(snap, fc, &fakePublisher{})
	body := hawk(project, "t", "g", false)
	withRep := fmt.Sprintf(`{"projectId":%q,"event":{"title":"t","groupHash":"g","repetitionId":"r1"}}`, project)
	long := strings.Repeat("x", 129)
	redelivered := delivery(body, "")
	redelivered.Redelivered = true
	b := &queue.Batch{Deliveries: []queue.Delivery{
		delivery(body, ""), delivery(body, ""), redelivered,
		delivery(withRep, ""), delivery(withRep, "m9"), delivery(body, long), delivery(body, long),
	}}
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	evs := fc.calls[0]
	var ids []string
	for _, ev := range evs {
		ids = append(ids, ev.ID)
	}
	if ids[0] != "" || ids[1] != "" || ids[2] != "" || ids[3] != "rep:r1" || ids[4] != "id:m9" ||
		ids[5] != ids[6] || !strings.HasPrefix(ids[5], "sha256:") || len(ids[5]) > 128 {
		t.Errorf("ids %q: want none, none, none, the repetitionId, the message-id, a hash of the long id twice", ids)
	}
	if string(evs[0].Body) != body || evs[0].Redelivered || !evs[2].Redelivered {
		t.Errorf("events carry body %q and redelivered %v %v, want the body and false, true", evs[0].Body, evs[0].Redelivered, evs[2].Redelivered)
	}
}

func TestHandleCounterErrorHoldsTheBatch(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "all", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 10, ThresholdPeriod: 60_000, Channels: webhook()},
	}})
	pub := &fakePublisher{}
	e, m := newEvaluator(snap, &fakeCounter{err: fmt.Errorf("redis down")}, pub)
	b := &queue.Batch{Deliveries: []queue.Delivery{delivery(`nope`, ""), delivery(hawk(project, "t", "g", false), "")}}
	if err := e.Handle(context.Background(), b); err == nil || !strings.Contains(err.Error(), "redis down") {
		t.Fatalf("Handle = %v, want the counter's error", err)
	}
	if len(pub.msgs) != 0 || value(t, m.Events.WithLabelValues("dead")) != 0 {
		t.Errorf("a failed batch published %d messages or counted metrics", len(pub.msgs))
	}
}

// BenchmarkHandle is the evaluator's own cost per event (decode, rules,
// matching, building the counter's input, metrics), with a counter and a
// publisher that do nothing: 256 Hawk messages per batch over 100
// projects × 4 rules, as tools/bench generates them.
//
//	go test -run '^$' -bench Handle -benchmem ./internal/evaluator
func BenchmarkHandle(b *testing.B) {
	projects := map[string][]rules.Spec{}
	var ids []string
	for p := range 100 {
		id := fmt.Sprintf("5e3eef0679fa3700a01%05x", p)
		ids = append(ids, id)
		projects[id] = []rules.Spec{
			{ID: "r0", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 100, ThresholdPeriod: 60_000, Channels: webhook()},
			{ID: "r1", IsEnabled: true, WhatToReceive: rules.SeenMore, Including: []string{"error"},
				Windows: []rules.WindowSpec{{Threshold: 200, Period: 60_000}, {Threshold: 1000, Period: 600_000}}, Channels: webhook()},
			{ID: "r2", IsEnabled: true, WhatToReceive: rules.SeenMore, Excluding: []string{"staging"}, Threshold: 1000, ThresholdPeriod: 3_600_000, Channels: webhook()},
			{ID: "r3", IsEnabled: true, WhatToReceive: rules.OnlyNew, Including: []string{"database"}, Channels: webhook()},
		}
	}
	snap := compile(b, projects)
	e, _ := newEvaluator(snap, &fakeCounter{}, &fakePublisher{})
	batch := &queue.Batch{}
	for i := range 256 {
		rep := fmt.Sprintf("%024x", i)
		body := fmt.Sprintf(`{"projectId":%q,"event":{"title":"TypeError: Cannot read properties of undefined (reading 'id') [%d]","groupHash":"%064x","isNew":false,"repetitionId":%q}}`,
			ids[i%len(ids)], i%1000, i%1000, rep)
		batch.Deliveries = append(batch.Deliveries, queue.Delivery{Body: []byte(body), DeliveryTag: uint64(i + 1)})
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := e.Handle(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch.Deliveries)), "ns/event")
}

// notLoaded is a rule source whose first load has not succeeded.
type notLoaded struct{}

func (notLoaded) Matcher(string) *rules.Matcher { return nil }
func (notLoaded) Ready() bool                   { return false }

// Before any rules were loaded, a batch is held (not acked), not taken as
// events of projects without rules and dropped.
func TestHoldsEventsUntilRulesLoaded(t *testing.T) {
	fc := &fakeCounter{record: true}
	pub := &fakePublisher{}
	e, m := newEvaluator(nil, fc, pub)
	e.Rules = notLoaded{}
	b := &queue.Batch{Deliveries: []queue.Delivery{delivery(hawk(project, "Database down", "g1", true), "m1")}}
	if err := e.Handle(context.Background(), b); !errors.Is(err, evaluator.ErrRulesNotLoaded) {
		t.Fatalf("Handle = %v, want ErrRulesNotLoaded", err)
	}
	if len(fc.calls) != 0 || len(pub.msgs) != 0 {
		t.Errorf("counted %d batches and published %d messages before rules loaded", len(fc.calls), len(pub.msgs))
	}
	if got := value(t, m.Events.WithLabelValues("no_rules")); got != 0 {
		t.Errorf("%v events dropped as without rules", got)
	}
}

// Rules see the whole title, however long: a word past event.MaxTitle still
// excludes (or includes); only the title the channels get is cut.
func TestLongTitleMatchedWhole(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Excluding: []string{"staging"}, Channels: webhook()},
		{ID: "db", IsEnabled: true, WhatToReceive: rules.OnlyNew, Including: []string{"database"}, Channels: webhook()},
	}})
	fc := &fakeCounter{fire: map[string]bool{"new": true, "db": true}, record: true}
	pub := &fakePublisher{}
	e, _ := newEvaluator(snap, fc, pub)
	long := strings.Repeat("x", 2*event.MaxTitle)
	b := &queue.Batch{Deliveries: []queue.Delivery{
		delivery(hawk(project, long+" on STAGING", "g1", true), "m1"),    // excluded by "new", not included by "db"
		delivery(hawk(project, long+" Database down", "g2", true), "m2"), // both
	}}
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if got, want := counted(fc.calls[0]), "g2=new+db"; got != want {
		t.Errorf("counted %q, want %q", got, want)
	}
	if len(pub.msgs) != 1 {
		t.Fatalf("%d jobs, want one for both rules' webhook", len(pub.msgs))
	}
	for _, msg := range pub.msgs {
		job, err := wire.DecodeJob(msg.Body)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range job.Firings { // both rules, on one webhook: one grouped job
			if n := len(f.Notification.Event.Title); n > event.MaxTitle+len("…") {
				t.Errorf("a notification carries a title of %d bytes", n)
			}
		}
	}
}

// Hawk writes project ids in lower case, but a 24-hex id in upper case is
// the same project: it must count in the same counters and fire once.
func TestUpperCaseProjectIDCountsWithLowerCase(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: webhook()},
	}})
	fc := &fakeCounter{fire: map[string]bool{"new": true}, record: true}
	pub := &fakePublisher{}
	e, _ := newEvaluator(snap, fc, pub)
	b := &queue.Batch{Deliveries: []queue.Delivery{delivery(hawk(strings.ToUpper(project), "x", "g", true), "m1")}}
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if got := fc.calls[0][0].ProjectID; got != project {
		t.Errorf("counted under project %q, want %q", got, project)
	}
	job, err := wire.DecodeJob(pub.msgs[0].Body)
	if err != nil {
		t.Fatal(err)
	}
	if n := job.Firings[0].Notification; job.ProjectID != project || n.ProjectID != project {
		t.Errorf("job of project %q, notification of %q; want %q", job.ProjectID, n.ProjectID, project)
	}
}

// counted is what a counter call counted: "group=rule+rule" per event.
func counted(evs []counter.Event) string {
	var got []string
	for _, ev := range evs {
		var ids []string
		for _, r := range ev.Rules {
			ids = append(ids, r.ID)
		}
		got = append(got, ev.GroupHash+"="+strings.Join(ids, "+"))
	}
	return strings.Join(got, " ")
}

// A Hawk rule whose telegram channel is enabled but was saved without an
// endpoint (hawk.api only required one channel to have one) still notifies
// its email, as Hawk's notifier does: one job, for email only.
func TestHawkRuleWithEmptyEnabledChannelNotifiesTheOthers(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: map[string]rules.ChannelSpec{
			rules.Email:    {IsEnabled: true, Endpoint: "ops@example.com", MinPeriod: 60},
			rules.Telegram: {IsEnabled: true, Endpoint: "", MinPeriod: 60},
			rules.Slack:    {IsEnabled: false, Endpoint: "", MinPeriod: 60},
		}},
	}})
	fc := &fakeCounter{fire: map[string]bool{"new": true}, record: true}
	pub := &fakePublisher{}
	e, _ := newEvaluator(snap, fc, pub)
	b := &queue.Batch{Deliveries: []queue.Delivery{delivery(hawk(project, "TypeError: x", "g", true), "")}}
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	var channels []string
	for _, msg := range pub.msgs {
		job, err := wire.DecodeJob(msg.Body)
		if err != nil {
			t.Fatal(err)
		}
		channels = append(channels, job.Channel)
	}
	if strings.Join(channels, ",") != rules.Email {
		t.Errorf("jobs for %v, want email only", channels)
	}
}

// repetitionId has no limit of its own: a 200 KB one was copied into every
// channel's message. Notifications carry it up to 128 bytes, and a longer
// one as its hash, which keeps distinct ids distinct.
func TestLongRepetitionIDIsBounded(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: webhook()},
	}})
	pub := &fakePublisher{}
	e, _ := newEvaluator(snap, &fakeCounter{fire: map[string]bool{"new": true}}, pub)
	body := func(rep string) string {
		return fmt.Sprintf(`{"projectId":%q,"event":{"title":"T","groupHash":"g","isNew":true,"repetitionId":%q}}`, project, rep)
	}
	huge, hugeToo := strings.Repeat("r", 200<<10), strings.Repeat("r", 200<<10-1)+"s"
	b := &queue.Batch{Deliveries: []queue.Delivery{
		delivery(body("64b7f0c2a1b2c3d4e5f60001"), "m1"),
		delivery(body(huge), "m2"),
		delivery(body(hugeToo), "m3"),
	}}
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	var reps []string
	for _, msg := range pub.msgs {
		job, err := wire.DecodeJob(msg.Body)
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Body) > 4<<10 {
			t.Errorf("a delivery job of %d bytes", len(msg.Body))
		}
		reps = append(reps, *job.Firings[0].Notification.Event.RepetitionID)
	}
	if len(reps) != 3 || reps[0] != "64b7f0c2a1b2c3d4e5f60001" || reps[1] == reps[2] ||
		!strings.HasPrefix(reps[1], "sha256:") || len(reps[1]) > 128 {
		t.Errorf("repetition ids %.80q, want the short one as is and the long ones as distinct hashes", reps)
	}
}

// blockingCounter holds its first call until release, and counts the calls
// in it at once.
type blockingCounter struct {
	fakeCounter
	mu       sync.Mutex
	active   int
	entered  chan struct{} // one value per call
	release  chan struct{}
	overlaps atomic.Int64
}

func (f *blockingCounter) ObserveBatch(ctx context.Context, token int64, events []counter.Event) ([]counter.Result, error) {
	f.mu.Lock()
	f.active++
	if f.active > 1 {
		f.overlaps.Add(1)
	}
	f.mu.Unlock()
	f.entered <- struct{}{}
	<-f.release
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active--
	f.reuse = nil // results of their own: the caller reads them unlocked
	return f.fakeCounter.ObserveBatch(ctx, token, events)
}

type lockedPublisher struct {
	mu sync.Mutex
	fakePublisher
}

func (p *lockedPublisher) Publish(ctx context.Context, msgs ...queue.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fakePublisher.Publish(ctx, msgs...)
}

// Batches handled at once (the consumer's Concurrency) count one at a
// time: two counting together would lose their compare-and-sets to each
// other on the groups both hold.
func TestBatchesCountOneAtATime(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: webhook()},
	}})
	fc := &blockingCounter{fakeCounter: fakeCounter{fire: map[string]bool{"new": true}},
		entered: make(chan struct{}, 2), release: make(chan struct{})}
	e, _ := newEvaluator(snap, fc, &lockedPublisher{})
	handled := make(chan error, 2)
	handle := func(id string) {
		b := &queue.Batch{Deliveries: []queue.Delivery{delivery(hawk(project, "E", "g", true), id)}}
		handled <- e.Handle(context.Background(), b)
	}
	go handle("m1")
	<-fc.entered
	go handle("m2")
	// The second batch must not get in while the first counts. A bounded
	// wait for something that must not happen.
	select {
	case <-fc.entered:
		t.Error("a second batch counted while the first was counting")
	case <-time.After(200 * time.Millisecond):
	}
	close(fc.release)
	for range 2 {
		if err := <-handled; err != nil {
			t.Fatal(err)
		}
	}
	if n := fc.overlaps.Load(); n != 0 {
		t.Errorf("%d calls overlapped another", n)
	}
}

// storms records the firings it is told of, as storm.Tracker would start
// storms for them.
type storms struct {
	started []string
	err     error
}

func (s *storms) Wants(r *rules.Rule) bool { return r.WantsStormOver(false) }

func (s *storms) Start(_ context.Context, r *rules.Rule, w int, n *notify.Notification) error {
	s.started = append(s.started, fmt.Sprintf("%s/%d/%s/%s", r.ID, w, n.ID, n.Event.URL))
	return s.err
}

func TestFiringsOfStormOverRulesStartStorms(t *testing.T) {
	on := true
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "storm", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 2, ThresholdPeriod: 60_000, StormOver: &on, Channels: webhook()},
		{ID: "plain", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 2, ThresholdPeriod: 60_000, Channels: webhook()},
	}})
	pub := &fakePublisher{}
	e, _ := newEvaluator(snap, &fakeCounter{fire: map[string]bool{"storm": true, "plain": true}}, pub)
	e.EventURL = evaluator.Link{Template: "https://hawk.example/{groupHash}"}
	st := &storms{}
	e.Storms = st
	b := &queue.Batch{Deliveries: []queue.Delivery{delivery(hawk(project, "t", "g", false), "")}}
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if want := "storm/0/firing-storm/https://hawk.example/g"; len(st.started) != 1 || st.started[0] != want {
		t.Fatalf("storms started %q, want %q only", st.started, want)
	}
	// A storm that cannot be recorded holds the batch: it comes again, its
	// firings replayed, and the storm is started then.
	st.err = errors.New("redis down")
	if err := e.Handle(context.Background(), b); err == nil || !strings.Contains(err.Error(), "redis down") {
		t.Fatalf("Handle = %v, want the storm's error", err)
	}
}

// At debug, every counted event is logged with its identity and what it
// fired, so that a notification missing after a failure can be followed
// to the batch that counted its events; above debug, nothing is.
func TestDebugLogTracesEveryCountedEvent(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "new", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: webhook()},
	}})
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		var out strings.Builder
		e, _ := newEvaluator(snap, &fakeCounter{fire: map[string]bool{"new": true}}, &fakePublisher{})
		e.Log = slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: level}))
		b := &queue.Batch{Deliveries: []queue.Delivery{delivery(hawk(project, "boom", "g1", true), "m1")}}
		if err := e.Handle(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		traced := strings.Contains(out.String(), `"msg":"event counted","project":"`+project+`","group":"g1","id":"id:m1","redelivered":false,"duplicate":false,"fired":["new"]`)
		if traced != (level == slog.LevelDebug) {
			t.Errorf("at %v, traced = %t; log:\n%s", level, traced, out.String())
		}
	}
}

// A link by {eventId} needs the group's id from Hawk's events database;
// without it the fallback stands in (or no link), while a template by
// {groupHash} never needs one. What comes from events is escaped to one
// path segment.
func TestLinkByEventIDFallsBackWithoutOne(t *testing.T) {
	garage := evaluator.Link{
		Template: "https://garage.hawk.so/project/{projectId}/event/{eventId}/overview",
		Fallback: "https://garage.hawk.so/project/{projectId}#{groupHash}",
	}
	byHash := evaluator.Link{Template: "https://t.example/{projectId}/{groupHash}", Fallback: "https://unused.example"}
	for _, tt := range []struct {
		link                    evaluator.Link
		project, group, eventID string
		want                    string
	}{
		{garage, project, "g", "65f0c0ffee0000000000beef", "https://garage.hawk.so/project/" + project + "/event/65f0c0ffee0000000000beef/overview"},
		{garage, project, "g", "", "https://garage.hawk.so/project/" + project + "#g"},
		{evaluator.Link{Template: garage.Template}, project, "g", "", ""},
		{byHash, project, "a/b?c", "", "https://t.example/" + project + "/a%2Fb%3Fc"},
		{byHash, project, "g", "65f0c0ffee0000000000beef", "https://t.example/" + project + "/g"},
		{garage, project, "g", "x/../y", "https://garage.hawk.so/project/" + project + "/event/x%2F..%2Fy/overview"},
		{evaluator.Link{}, project, "g", "65f0", ""},
	} {
		if got := tt.link.URL(tt.project, tt.group, tt.eventID); got != tt.want {
			t.Errorf("%+v with group %q, id %q: %q, want %q", tt.link, tt.group, tt.eventID, got, tt.want)
		}
	}
}

// starvedSeen records what an evaluator tells its Starved.
type starvedSeen map[string]int

func (s starvedSeen) Saw(_ context.Context, project string, r *rules.Rule, reason string, n int) {
	s[project+"/"+r.ID+"/"+reason] += n
}

// Only the users rule starves, only of events without a user, and only a
// batch that was counted is told of: one held for a retry is told of when
// it succeeds, so nothing is counted twice.
func TestStarvedIsToldOfUsersRulesEventsWithoutUsers(t *testing.T) {
	snap := compile(t, map[string][]rules.Spec{project: {
		{ID: "users", IsEnabled: true, WhatToReceive: rules.SeenMore, CountBy: rules.CountUsers, Threshold: 5, ThresholdPeriod: 60_000, Channels: webhook()},
		{ID: "events", IsEnabled: true, WhatToReceive: rules.SeenMore, Threshold: 5, ThresholdPeriod: 60_000, Channels: webhook()},
	}})
	c := &fakeCounter{err: errors.New("redis down")}
	e, _ := newEvaluator(snap, c, &fakePublisher{})
	seen := starvedSeen{}
	e.Starved = seen
	withUser := fmt.Sprintf(`{"projectId":%q,"event":{"title":"t","groupHash":"g","isNew":false,"repetitionId":null,"user":{"id":"alice"}}}`, project)
	b := &queue.Batch{Deliveries: []queue.Delivery{
		delivery(hawk(project, "t", "g", false), ""), delivery(hawk(project, "t", "g", false), ""), delivery(withUser, ""),
	}}
	if err := e.Handle(context.Background(), b); err == nil {
		t.Fatal("Handle succeeded with the counter down")
	}
	if len(seen) != 0 {
		t.Fatalf("a batch held for a retry told of %v", seen)
	}
	c.err = nil
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if want := (starvedSeen{project + "/users/no_user": 2}); !maps.Equal(seen, want) {
		t.Errorf("told of %v, want %v", seen, want)
	}
}
