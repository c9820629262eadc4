package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// fairBound is the fairness promise of docs/guarantees.md: whatever one
// project does, another project's new-error notification arrives within 2 s.
const fairBound = 2 * time.Second

// hungServer takes requests and never answers them until the test ends.
func hungServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var arrived atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	var once sync.Once
	// Registered before the worker's cleanup, so run after it: the worker
	// stops first, then the hung requests end, then the server closes.
	t.Cleanup(func() { once.Do(func() { close(release) }); srv.Close() })
	return srv, &arrived
}

// newErrorArrives publishes a new error of project and returns how long
// its webhook notification took to arrive, failing past twice the bound
// (so that the log says by how much).
func (h *harness) newErrorArrives(project string) time.Duration {
	h.t.Helper()
	before := len(h.webhook.Requests())
	start := time.Now()
	h.publish(event(project, "TypeError: the other project's new error", "other-group", true))
	if _, err := h.webhook.WaitFor(before+1, 2*fairBound); err != nil {
		h.t.Fatalf("the other project's notification did not arrive within %s: %v", 2*fairBound, err)
	}
	return time.Since(start)
}

// A project whose 1,000 rules point at a URL that never answers (3 s send
// timeout) must not delay another project's notification:
// the hung destination holds at most its share of the worker's sends, and
// once its sends keep timing out its circuit opens, said once in the log,
// without the URL. Unbounded, its jobs would take all 64 sends, and every
// other project's notification would wait behind their timeouts.
func TestHungEndpointOfOneProjectDoesNotDelayAnother(t *testing.T) {
	// Not parallel: the bound under test is time, which a machine busy with
	// the other tests' workers would eat into.
	h := newHarness(t)
	hung, arrived := hungServer(t)
	const secret = "T0-hung-secret-path"
	hungURL := hung.URL + "/hook/" + secret
	// 1,000 new groups, each a job for the hung URL (the firings of one
	// event would share one message).
	const n = 1000
	attacker := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW",
		"channels": bson.M{"webhook": bson.M{"isEnabled": true, "endpoint": hungURL, "minPeriod": 0}}}))
	other := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	h.env["KLAXON_RULES_REFRESH"] = "5s"
	h.env["KLAXON_SEND_TIMEOUT"] = "3s"
	w := h.start()

	var hangs []message
	for g := range n {
		hangs = append(hangs, event(attacker, "Error: everything hangs", fmt.Sprintf("hung-%d", g), true))
	}
	h.publish(hangs...)
	testenv.WaitFor(t, 30*time.Second, "the hung endpoint to be sent to", func() bool { return arrived.Load() > 0 })
	// Timed once the evaluator has counted them all, as when they were the
	// firings of one event: the bound is the deliverer's, not the incoming
	// queue's order.
	w.waitMetric(t, 60*time.Second, "the 1,000 events counted", func(v float64) bool { return v >= n },
		"klaxon_events_total", "outcome", "counted")
	took := h.newErrorArrives(other)
	t.Logf("the other project's notification took %s; %d requests reached the hung endpoint", took.Round(time.Millisecond), arrived.Load())
	if took > fairBound {
		t.Errorf("the other project's notification took %s, want at most %s", took.Round(time.Millisecond), fairBound)
	}

	w.waitMetric(t, 30*time.Second, "the hung destination's circuit to open", func(v float64) bool { return v >= 1 },
		"klaxon_circuit_changes_total", "channel", "webhook", "state", "open")
	// The circuit keeps the jobs away: they wait in the retry queues, each
	// wait an attempt; none is dropped, none is sent to the endpoint.
	w.waitMetric(t, 30*time.Second, "jobs parked by the circuit", func(v float64) bool { return v > 0 },
		"klaxon_notifications_total", "channel", "webhook", "outcome", "parked")
	if v := w.metric(t, "klaxon_notifications_total", "channel", "webhook", "outcome", "failed"); v != 0 {
		t.Errorf("%v jobs failed for good; want them kept for later attempts", v)
	}
	if got := arrived.Load(); got > 2*16 {
		t.Errorf("%d requests reached the hung endpoint; at most its host's 16 sends and one more round before the circuit opened", got)
	}
	if got := h.logCount("circuit opened: the host keeps timing out; its jobs wait in the retry queues"); got != 1 {
		t.Errorf("%d log lines say the circuit opened, want 1", got)
	}
	if strings.Contains(h.logs.String(), secret) {
		t.Error("the endpoint URL is in the logs")
	}
}

// A project whose 3,000 notifications go to one Slack webhook (paced at one
// a second) must not delay another project's notification, and its jobs
// wait for their turns instead of cycling through the retry queue: each is
// throttled once, when its turn is reserved. Jobs that asked again at every
// pass would cycle through the retry queue thousands of times, spending the
// broker's CPU.
func TestSlackFloodOfOneProjectDoesNotDelayAnother(t *testing.T) {
	// Not parallel: the bound under test is time, which a machine busy with
	// the other tests' workers would eat into.
	h := newHarness(t)
	// One rule, 3,000 new groups: a job each (the firings of one event
	// would share one message).
	const groups = 3000
	attacker := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW",
		"channels": bson.M{"slack": bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0}}}))
	other := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	h.env["KLAXON_RULES_REFRESH"] = "5s"
	w := h.start()

	var flood []message
	for g := range groups {
		flood = append(flood, event(attacker, "Error: a flood for one Slack webhook", fmt.Sprintf("flood-%d", g), true))
	}
	h.publish(flood...)
	const jobs = groups
	w.waitMetric(t, 60*time.Second, "the flood's jobs to wait for their turns", func(v float64) bool { return v >= jobs/2 },
		"klaxon_notifications_total", "channel", "slack", "outcome", "throttled")
	// Measured once every job of the flood has reserved its turn (one
	// rule, 3,000 events: the flood comes through the evaluator, not all
	// at once): the bound is on the turns waiting, not on the queues'
	// order.
	testenv.WaitFor(t, 60*time.Second, "every job of the flood to have its turn", func() bool {
		return w.metric(t, "klaxon_notifications_total", "channel", "slack", "outcome", "throttled")+
			w.metric(t, "klaxon_notifications_total", "channel", "slack", "outcome", "sent") >= jobs
	})
	took := h.newErrorArrives(other)
	t.Logf("the other project's notification took %s", took.Round(time.Millisecond))
	if took > fairBound {
		t.Errorf("the other project's notification took %s, want at most %s", took.Round(time.Millisecond), fairBound)
	}

	// A few turns later, the jobs still wait for their turns.
	sent0 := w.metric(t, "klaxon_notifications_total", "channel", "slack", "outcome", "sent")
	w.waitMetric(t, 30*time.Second, "three more turns", func(v float64) bool { return v >= sent0+3 },
		"klaxon_notifications_total", "channel", "slack", "outcome", "sent")
	throttled := w.metric(t, "klaxon_notifications_total", "channel", "slack", "outcome", "throttled")
	sent := w.metric(t, "klaxon_notifications_total", "channel", "slack", "outcome", "sent")
	t.Logf("%v throttled passes, %v sent", throttled, sent)
	// Each job reserves its turn once, and comes back once, at it.
	if throttled > jobs {
		t.Errorf("%v throttled passes for %d jobs: jobs cycle through the retry queue", throttled, jobs)
	}
}

// Jobs over a provider's pace reserve their turn and come back once, at
// it: throttled passes stay within twice the messages sent, and
// the pace holds (one a second for a Slack webhook).
func TestThrottledPassesAtMostTwiceSent(t *testing.T) {
	// Not parallel: the bound under test is time, which a machine busy with
	// the other tests' workers would eat into.
	h := newHarness(t)
	const n = 12
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW",
		"channels": bson.M{"slack": bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0}}}))
	w := h.start()
	var msgs []message
	for g := range n {
		msgs = append(msgs, event(project, "Error: twelve groups, one webhook", fmt.Sprint("paced-", g), true))
	}
	h.publish(msgs...)
	reqs, err := h.slack.WaitFor(n, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	throttled := w.metric(t, "klaxon_notifications_total", "channel", "slack", "outcome", "throttled")
	sent := w.metric(t, "klaxon_notifications_total", "channel", "slack", "outcome", "sent")
	t.Logf("%v throttled passes, %v sent", throttled, sent)
	if sent != n || throttled > 2*sent || throttled == 0 {
		t.Errorf("%v throttled passes for %v sent, want some and at most twice as many", throttled, sent)
	}
	// One a second: a job held past its turn by the delay queue may go
	// right before the next, but none goes before its turn.
	if span := reqs[n-1].Received.Sub(reqs[0].Received); span < (n-1)*time.Second-100*time.Millisecond {
		t.Errorf("%d Slack requests within %s, want one a second", n, span)
	}
}

// A project whose 100 rules each exclude 50 words that substring search
// finds hardest (runs of one letter ending in another, against a title of
// 8 KiB of that letter) must not delay another project's notification:
// matching costs an event its title's length, whatever the project's
// words. Searched word by word, each such event would cost ~150 ms, and a
// burst of them would hold the evaluator's batches for seconds.
func TestPathologicalFiltersOfOneProjectDoNotDelayAnother(t *testing.T) {
	// Not parallel: the bound under test is time, which a machine busy with
	// the other tests' workers would eat into.
	h := newHarness(t)
	// Today's default limits, stated: the attack stays within them.
	for k, v := range map[string]string{
		"KLAXON_MAX_RULES_PER_PROJECT":   "100",
		"KLAXON_MAX_FILTER_WORDS":        "50",
		"KLAXON_MAX_FILTER_WORD_BYTES":   "200",
		"KLAXON_MAX_FILTER_BYTES":        "4096",
		"KLAXON_MAX_MATCHED_TITLE_BYTES": "8192",
	} {
		h.env[k] = v
	}
	var rs []bson.M
	for i := range 100 {
		words := bson.A{}
		for k := range 49 {
			words = append(words, strings.Repeat("a", 59+(i+k)%21)+"b") // 60-80 bytes, none in the title
		}
		// In the title, and last: every rule searches all its words, then
		// excludes the event, so the attack costs matching alone.
		words = append(words, "aaaa")
		rs = append(rs, rule(bson.M{"whatToReceive": "ONLY_NEW", "excluding": words, "channels": h.webhookOnly()}))
	}
	attacker := h.project(rs...)
	other := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	w := h.start()

	const burst = 100
	title := strings.Repeat("A", 8192)
	var msgs []message
	for i := range burst {
		msgs = append(msgs, event(attacker, title, fmt.Sprint("attack-", i), true))
	}
	h.publish(msgs...)
	took := h.newErrorArrives(other)
	t.Logf("the other project's notification took %s behind %d pathological events", took.Round(time.Millisecond), burst)
	if took > fairBound {
		t.Errorf("the other project's notification took %s, want at most %s", took.Round(time.Millisecond), fairBound)
	}
	// The attack was matched, and excluded, rule by rule: not skipped.
	w.waitMetric(t, 30*time.Second, "the attacker's events to be matched and excluded", func(v float64) bool { return v >= burst },
		"klaxon_events_total", "outcome", "unmatched")
	if got := len(h.webhook.Requests()); got != 1 {
		t.Errorf("%d webhook requests, want the other project's one", got)
	}
	if n := h.logCount("rule skipped"); n != 0 {
		t.Errorf("%d rules skipped; the attack must stay within the limits", n)
	}
}
