package watchdog_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/watchdog"
)

const limit = time.Minute

// fleet is workers' watchdogs sharing Redis, a clock the test moves, the
// queue depth they see and the operator's webhook.
type fleet struct {
	t       *testing.T
	sink    *notifytest.WebhookSink
	mu      sync.Mutex
	now     time.Time
	depth   int
	dogs    []*watchdog.Watchdog
	metrics []*metrics.Metrics
}

func newFleet(t *testing.T, workers int, more ...watchdog.Notifier) *fleet {
	f := &fleet{t: t, sink: notifytest.NewWebhookSink(t), now: time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)}
	rdb := testenv.Redis(t)
	prefix := testenv.KeyPrefix(t)
	for i := range workers {
		m := metrics.New(prometheus.NewRegistry())
		f.metrics = append(f.metrics, m)
		f.dogs = append(f.dogs, watchdog.New(watchdog.Config{
			Limit: limit, Interval: time.Second, Queues: []string{"deliveries"},
			Depth: func(context.Context, string) (int, error) {
				f.mu.Lock()
				defer f.mu.Unlock()
				return f.depth, nil
			},
			Metrics: m, Redis: rdb, Prefix: prefix, Worker: string(rune('a' + i)),
			Notifier: append(watchdog.Each{&watchdog.Webhook{URL: f.sink.URL}}, more...),
			Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
			Now: func() time.Time {
				f.mu.Lock()
				defer f.mu.Unlock()
				return f.now
			},
		}))
	}
	return f
}

// step moves the clock by d and lets every watchdog look.
func (f *fleet) step(d time.Duration, depth int) {
	f.mu.Lock()
	f.now, f.depth = f.now.Add(d), depth
	f.mu.Unlock()
	for _, w := range f.dogs {
		w.Look(context.Background())
	}
}

func (f *fleet) alerts() []watchdog.Alert {
	var out []watchdog.Alert
	for _, r := range f.sink.Requests() {
		var a watchdog.Alert
		if err := r.JSON(&a); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

func (f *fleet) states() []string {
	var s []string
	for _, a := range f.alerts() {
		s = append(s, a.Incident+" "+a.State)
	}
	return s
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStalledQueueAlertsOncePerIncident: messages waiting and none taken
// for the limit is an incident; three workers that all see it send one
// "delayed", and one "recovered" when the queue moves. Less than the
// limit, or a queue that drains bit by bit, is none.
func TestStalledQueueAlertsOncePerIncident(t *testing.T) {
	f := newFleet(t, 3)
	f.step(0, 5)
	f.step(limit-time.Second, 5)
	if n := len(f.alerts()); n != 0 {
		t.Fatalf("%d alerts before the limit", n)
	}
	f.step(time.Second, 6)
	f.step(time.Second, 7)
	if got := f.states(); !equal(got, []string{"delayed delayed"}) {
		t.Fatalf("alerts %v, want one delayed", got)
	}
	if a := f.alerts()[0]; a.Since.IsZero() || a.Reasons[0] != "queue deliveries: 6 messages waiting, none taken for 1m0s" {
		t.Fatalf("alert %+v", a)
	}
	f.step(time.Second, 0)
	f.step(time.Second, 0)
	if got := f.states(); !equal(got, []string{"delayed delayed", "delayed recovered"}) {
		t.Fatalf("alerts %v, want delayed then recovered", got)
	}
	for _, m := range f.metrics[1:] {
		if v := value(m.OperatorAlerts.WithLabelValues("delayed")); v != 0 {
			t.Fatalf("a second worker counted %v alerts", v)
		}
	}
	// A queue that is worked through, however slowly, is no stall.
	for n := 100; n > 0; n-- {
		f.step(10*time.Second, n)
	}
	if n := len(f.alerts()); n != 2 {
		t.Fatalf("%d alerts for a queue that drains", n)
	}
	// A new stall is a new incident.
	f.step(time.Second, 3)
	f.step(limit, 3)
	if got := f.states(); len(got) != 3 || got[2] != "delayed delayed" {
		t.Fatalf("alerts %v, want a second delayed", got)
	}
}

// TestAlertNotSentIsTriedAgain: an operator webhook that fails does not
// use up the incident: the next look sends it.
func TestAlertNotSentIsTriedAgain(t *testing.T) {
	f := newFleet(t, 2)
	f.sink.FailNext(1, notifytest.Failure{Status: 503})
	f.step(0, 1)
	f.step(limit, 1)
	f.step(time.Second, 1)
	if got := f.states(); !equal(got, []string{"delayed delayed", "delayed delayed"}) {
		t.Fatalf("alerts %v, want the failed one and its retry", got)
	}
	if v := value(f.metrics[0].OperatorAlerts.WithLabelValues("error")) +
		value(f.metrics[1].OperatorAlerts.WithLabelValues("error")); v != 1 {
		t.Fatalf("%v errors counted, want 1", v)
	}
}

// TestLateEventsAndFailingChannel: events counted later than the limit
// delay notifications; a channel with failures and nothing sent for the
// limit is failing, and recovers when it sends again. A channel that
// fails for one endpoint while it sends to others is not.
func TestLateEventsAndFailingChannel(t *testing.T) {
	f := newFleet(t, 1)
	m := f.metrics[0]
	f.step(0, 0)
	m.EventLag.Observe((2 * limit).Seconds())
	f.step(time.Second, 0)
	if got := f.states(); !equal(got, []string{"delayed delayed"}) {
		t.Fatalf("alerts %v, want delayed for late events", got)
	}
	m.EventLag.Observe(1)
	f.step(time.Second, 0)

	m.Notifications.WithLabelValues("slack", "failed").Add(2)
	m.Notifications.WithLabelValues("email", "failed").Add(5)
	m.Notifications.WithLabelValues("email", "sent").Add(1)
	f.step(time.Second, 0)
	m.Notifications.WithLabelValues("slack", "failed").Add(1)
	f.step(time.Second, 0)
	want := []string{"delayed delayed", "delayed recovered", "failing:slack failing"}
	if got := f.states(); !equal(got, want) {
		t.Fatalf("alerts %v, want %v", got, want)
	}
	m.Notifications.WithLabelValues("slack", "sent").Inc()
	f.step(time.Second, 0)
	if got := f.states(); len(got) != 4 || got[3] != "failing:slack recovered" {
		t.Fatalf("alerts %v, want slack recovered", got)
	}
	// A circuit open for the whole limit, nothing sent: failing.
	m.CircuitsOpen.WithLabelValues("webhook").Set(1)
	for range 61 {
		f.step(time.Second, 0)
	}
	if got := f.states(); len(got) != 5 || got[4] != "failing:webhook failing" {
		t.Fatalf("alerts %v, want webhook failing", got)
	}
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestAlertSentSomewhereIsNotRepeated: with a webhook and a second
// destination, one that fails does not make the other repeat the alert;
// the failure is counted.
func TestAlertSentSomewhereIsNotRepeated(t *testing.T) {
	other := notifytest.NewWebhookSink(t)
	f := newFleet(t, 1, &watchdog.Webhook{URL: other.URL})
	other.FailNext(1, notifytest.Failure{Status: 500})
	f.step(0, 1)
	f.step(limit, 1)
	f.step(time.Second, 1)
	if got := f.states(); !equal(got, []string{"delayed delayed"}) {
		t.Fatalf("alerts %v, want one", got)
	}
	if n := len(other.Requests()); n != 1 {
		t.Fatalf("the failing destination got %d requests, want 1 (no retry)", n)
	}
	if v := value(f.metrics[0].OperatorAlerts.WithLabelValues("error")); v != 1 {
		t.Fatalf("%v errors counted, want 1", v)
	}
}
