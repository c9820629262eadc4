package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// The cases below hold the promise of README "Fairness" against the shapes
// of load that broke it before: whatever other projects and providers do,
// a project's new-error notification arrives within fairBound on every
// channel that is not itself down. Each publishes the other projects' load
// first, waits until its sends are under way, then times the victim's
// notifications, one new error at a time.

// fairTries is how many of the victim's notifications each case times:
// KLAXON_TEST_FAIR_TRIES, 5 by default. The cases run only with
// KLAXON_TEST_FAIRNESS=1, alone (scripts/test.sh runs them last): what
// they bound is time, which a machine busy with other packages' tests
// would eat into.
func fairTries(t *testing.T) int {
	if os.Getenv("KLAXON_TEST_FAIRNESS") != "1" {
		t.Skip("set KLAXON_TEST_FAIRNESS=1 to run the fairness cases, alone")
	}
	if v := os.Getenv("KLAXON_TEST_FAIR_TRIES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("KLAXON_TEST_FAIR_TRIES=%q: want a whole number above 0", v)
		}
		return n
	}
	return 5
}

// provider is an HTTP endpoint on loopback standing for a provider that
// misbehaves: it takes requests and holds them unanswered (hang), answers
// 429 with Retry-After: 3600 (refuse), or answers 200 "ok", as Slack's
// webhooks do (answer). A held request ends only when its client gives up:
// it never counts as delivered. It listens on one or more addresses.
type provider struct {
	mode     atomic.Int32
	arrived  atomic.Int64
	inFlight atomic.Int64
	peak     atomic.Int64 // the most requests held at once
	mu       sync.Mutex
	answered map[string]int // notification ids answered 200, each with how many times
	release  chan struct{}
}

const (
	hang int32 = iota
	refuse
	answer
)

func newProvider(t *testing.T, mode int32) *provider {
	p := &provider{answered: map[string]int{}, release: make(chan struct{})}
	p.mode.Store(mode)
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(p.release) }) })
	return p
}

// listen serves p on addr ("127.0.0.1:0" for any port) until the test
// ends, and returns the base URL.
func (p *provider) listen(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	// Registered before the worker's cleanup, so run after it: the worker
	// stops first, then the held requests end, then the server closes.
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.arrived.Add(1)
	body, _ := io.ReadAll(r.Body)
	switch p.mode.Load() {
	case hang:
		n := p.inFlight.Add(1)
		defer p.inFlight.Add(-1)
		for peak := p.peak.Load(); n > peak && !p.peak.CompareAndSwap(peak, n); peak = p.peak.Load() {
		}
		select {
		case <-p.release:
		case <-r.Context().Done():
		}
		return
	case refuse:
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, "rate_limited")
		return
	}
	var m struct {
		Notifications []struct {
			ID string `json:"id"`
		} `json:"notifications"`
		ID     string           `json:"id"` // a webhook's single firing
		Blocks []map[string]any `json:"blocks"`
		Text   string           `json:"text"`
	}
	json.Unmarshal(body, &m)
	p.mu.Lock()
	for _, n := range m.Notifications {
		p.answered[n.ID]++
	}
	switch {
	case len(m.Notifications) > 0:
	case m.ID != "":
		p.answered[m.ID]++
	default:
		// A Slack message: each rule has a webhook URL of its own.
		p.answered[r.URL.Path]++
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "text/html")
	io.WriteString(w, "ok")
}

// delivered is how many notifications p answered 200 in all, and for
// each notification id (webhooks) or URL path (Slack) how many.
func (p *provider) delivered() (int, map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	total := 0
	for _, n := range p.answered {
		total += n
	}
	return total, maps.Clone(p.answered)
}

// hungSMTP accepts connections and never says a word: a mail server that
// hangs before its greeting.
func hungSMTP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go io.Copy(io.Discard, bufio.NewReader(c))
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// victimChannels are the channels a victim's rule sends on, each to the
// harness' fake of it.
type victimChannels []string

func (h *harness) victimRule(chans victimChannels) bson.M {
	all := h.allChannels()
	mine := bson.M{}
	for _, c := range chans {
		mine[c] = all[c]
	}
	return rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": mine})
}

// received is how many messages the fake of channel c has received.
func (h *harness) received(c string) int {
	switch c {
	case "webhook":
		return len(h.webhook.Requests())
	case "slack":
		return len(h.slack.Requests())
	case "telegram":
		return len(h.telegram.Requests())
	case "email":
		return len(h.smtp.Messages())
	}
	h.t.Fatalf("no fake for channel %s", c)
	return 0
}

// victimArrives publishes tries new errors of victim, one at a time, and
// checks that each arrives on every channel of chans within fairBound. It
// waits for each for twice the bound, so that the log says by how much a
// late one missed it, and logs the worker's goroutines, memory and open
// files at the end, when the other projects' load is at its peak.
func (h *harness) victimArrives(w *worker, victim string, chans victimChannels, tries int) {
	h.t.Helper()
	h.victimArrivesVia(w, victim, chans, tries, func(m message) { h.publish(m) })
}

// victimArrivesVia is victimArrives with the victim's events published by publish.
func (h *harness) victimArrivesVia(w *worker, victim string, chans victimChannels, tries int, publish func(message)) {
	h.t.Helper()
	var worst time.Duration
	for i := range tries {
		before := map[string]int{}
		for _, c := range chans {
			before[c] = h.received(c)
		}
		start := time.Now()
		ev := event(victim, "TypeError: the victim's new error", fmt.Sprintf("victim-%d", i), true)
		ev.Key = victim
		publish(ev)
		for _, c := range chans {
			testenv.WaitFor(h.t, 2*fairBound, "the victim's "+c+" notification", func() bool { return h.received(c) > before[c] })
			took := time.Since(start)
			worst = max(worst, took)
			if took > fairBound {
				h.t.Errorf("try %d: the victim's %s notification took %s, want at most %s", i+1, c, took.Round(time.Millisecond), fairBound)
			}
		}
		// Providers pace a destination at one message a second: a try
		// sooner would wait for its turn, not for the others' load.
		time.Sleep(time.Until(start.Add(1100 * time.Millisecond)))
	}
	h.t.Logf("%d tries on %s: the slowest notification took %s; worker at %v goroutines, %.0f MiB resident, %v open files",
		tries, strings.Join(chans, ", "), worst.Round(time.Millisecond),
		w.metric(h.t, "go_goroutines"), w.metric(h.t, "process_resident_memory_bytes")/(1<<20), w.metric(h.t, "process_open_fds"))
}

// publishNoisy publishes the noisy projects' events and waits until the
// evaluator has counted them all and the deliverer has taken up their
// jobs (each sending, put back or parked): the bound under test is the
// deliverer's during the others' outage, not the incoming queue's order.
func (h *harness) publishNoisy(w *worker, msgs []message) {
	h.t.Helper()
	h.publish(msgs...)
	w.waitMetric(h.t, 60*time.Second, "the noisy projects' events counted", func(v float64) bool { return v >= float64(len(msgs)) },
		"klaxon_events_total", "outcome", "counted")
	testenv.WaitFor(h.t, 60*time.Second, "the noisy jobs taken up", func() bool { return h.deliveryJobsReady(h.t) == 0 })
}

// noisyProjects stores n projects, each with rules rules that notify
// ONLY_NEW on channel at endpoint(project, rule), and returns errors new
// errors of each to publish: n × rules × errors jobs, none sharing a
// destination.
func (h *harness) noisyProjects(n, rules, errors int, channel string, endpoint func(p, r int) string) []message {
	h.t.Helper()
	var msgs []message
	for p := range n {
		var rs []bson.M
		for r := range rules {
			rs = append(rs, rule(bson.M{"whatToReceive": "ONLY_NEW",
				"channels": bson.M{channel: bson.M{"isEnabled": true, "endpoint": endpoint(p, r), "minPeriod": 0}}}))
		}
		id := h.project(rs...)
		for e := range errors {
			msgs = append(msgs, event(id, "Error: a noisy project's new error", fmt.Sprintf("noisy-%d-%d", p, e), true))
		}
	}
	return msgs
}

// Projects that send to one host that accepts and never answers, a
// distinct path for each rule, take at most the host's sends: 10 projects
// × 40 rules × 5 new errors (2,000 sends), then 100 projects × 4 rules. The
// host's circuit opens; no job is lost to it.
func TestFairnessHungHostOfManyProjects(t *testing.T) {
	tries := fairTries(t)
	for _, c := range []struct{ projects, rules int }{{10, 40}, {100, 4}} {
		t.Run(fmt.Sprintf("%d projects", c.projects), func(t *testing.T) {
			h := newHarness(t)
			hung := newProvider(t, hang)
			base := hung.listen(t, "127.0.0.1:0")
			h.env["KLAXON_SEND_TIMEOUT"] = "3s"
			chans := victimChannels{"webhook", "slack", "telegram", "email"}
			victim := h.project(h.victimRule(chans))
			noisy := h.noisyProjects(c.projects, c.rules, 5, "webhook", func(p, r int) string { return fmt.Sprintf("%s/p%d/r%d", base, p, r) })
			w := h.start()
			h.publishNoisy(w, noisy)
			testenv.WaitFor(t, 30*time.Second, "the hung host to be sent to", func() bool { return hung.arrived.Load() > 0 })
			h.victimArrives(w, victim, chans, tries)

			w.waitMetric(t, 30*time.Second, "the hung host's circuit to open", func(v float64) bool { return v >= 1 },
				"klaxon_circuit_changes_total", "channel", "webhook", "state", "open")
			// The server sees a request end only once it notices that the
			// worker gave up on it, which may come after the worker's next
			// request: a few over the budget are that, not more sends.
			if got := hung.peak.Load(); got > 16+5 {
				t.Errorf("the hung host held %d requests at once, want at most its 16 sends", got)
			}
			if v := w.metric(t, "klaxon_notifications_total", "channel", "webhook", "outcome", "failed"); v != 0 {
				t.Errorf("%v jobs failed for good; want them kept for later attempts", v)
			}
		})
	}
}

// 1,000 hanging endpoints, each an address of its own on loopback, over 10
// projects: each project takes at most its own sends, whatever hosts it
// names, and the webhook channel at most half of the worker's.
func TestFairnessThousandHungAddresses(t *testing.T) {
	tries := fairTries(t)
	h := newHarness(t)
	hung := newProvider(t, hang)
	var bases []string
	for i := range 1000 {
		bases = append(bases, hung.listen(t, fmt.Sprintf("127.0.%d.%d:0", 10+i/250, 1+i%250)))
	}
	h.env["KLAXON_SEND_TIMEOUT"] = "3s"
	chans := victimChannels{"webhook", "slack", "telegram", "email"}
	victim := h.project(h.victimRule(chans))
	noisy := h.noisyProjects(10, 100, 1, "webhook", func(p, r int) string { return bases[p*100+r] + "/hook" })
	w := h.start()
	h.publishNoisy(w, noisy)
	testenv.WaitFor(t, 30*time.Second, "the hung endpoints to be sent to", func() bool { return hung.arrived.Load() >= 10*32 })
	h.victimArrives(w, victim, chans, tries)
	if got := hung.peak.Load(); got > 10*32+10 { // see TestFairnessHungHostOfManyProjects
		t.Errorf("the hung endpoints held %d requests at once, want at most 10 projects' 32 sends", got)
	}
}

// Noisy projects whose every send is answered 429 with Retry-After: 3600
// do not delay another project: each of their jobs is tried, then waits
// out the hour in the retry queues.
func TestFairnessRateLimitedProjects(t *testing.T) {
	tries := fairTries(t)
	h := newHarness(t)
	limited := newProvider(t, refuse)
	base := limited.listen(t, "127.0.0.1:0")
	chans := victimChannels{"webhook", "slack", "telegram", "email"}
	victim := h.project(h.victimRule(chans))
	noisy := h.noisyProjects(10, 40, 5, "webhook", func(p, r int) string { return fmt.Sprintf("%s/p%d/r%d", base, p, r) })
	w := h.start()
	h.publishNoisy(w, noisy)
	testenv.WaitFor(t, 30*time.Second, "the noisy sends to be refused", func() bool { return limited.arrived.Load() > 0 })
	h.victimArrives(w, victim, chans, tries)
	w.waitMetric(t, 60*time.Second, "every noisy job tried once and put back", func(v float64) bool { return v >= 2000 },
		"klaxon_notifications_total", "channel", "webhook", "outcome", "retried")
	if v := w.metric(t, "klaxon_notifications_total", "channel", "webhook", "outcome", "failed"); v != 0 {
		t.Errorf("%v jobs failed for good; a Retry-After is a reason to wait, not to give up", v)
	}
}

// When Slack hangs for every project, the other channels of every project
// are unaffected, and once Slack answers again every Slack message goes
// out, each once.
func TestFairnessHungSlack(t *testing.T) {
	tries := fairTries(t)
	h := newHarness(t)
	slack := newProvider(t, hang)
	base := slack.listen(t, "127.0.0.1:0")
	h.env["KLAXON_SEND_TIMEOUT"] = "3s"
	h.env["KLAXON_CIRCUIT_OPEN"] = "2s"
	chans := victimChannels{"webhook", "telegram", "email"}
	victimRule := h.victimRule(chans)
	victimRule["channels"].(bson.M)["slack"] = bson.M{"isEnabled": true, "endpoint": base + "/services/victim", "minPeriod": 0}
	victim := h.project(victimRule)
	// 50 projects × 4 rules, a webhook URL each: 200 Slack messages.
	noisy := h.noisyProjects(50, 4, 1, "slack", func(p, r int) string { return fmt.Sprintf("%s/services/p%d/r%d", base, p, r) })
	w := h.start()
	h.publishNoisy(w, noisy)
	testenv.WaitFor(t, 30*time.Second, "Slack to be sent to", func() bool { return slack.arrived.Load() > 0 })
	h.victimArrives(w, victim, chans, tries)

	slack.mode.Store(answer)
	want := 200 + tries
	testenv.WaitFor(t, 90*time.Second, "every Slack message once Slack answers", func() bool {
		n, _ := slack.delivered()
		return n >= want
	})
	// Each recorded as sent: a repeat would be sent before its record.
	w.waitMetric(t, 30*time.Second, "the Slack sends recorded", func(v float64) bool { return v >= float64(want) },
		"klaxon_notifications_total", "channel", "slack", "outcome", "sent")
	n, byPath := slack.delivered()
	for path, got := range byPath {
		if want := map[bool]int{true: tries, false: 1}[path == "/services/victim"]; got != want {
			t.Errorf("Slack answered %d messages to %s, want %d", got, path, want)
		}
	}
	if n != want || len(byPath) != 201 {
		t.Errorf("Slack answered %d messages to %d webhooks, want %d to 201", n, len(byPath), want)
	}
}

// A mail server that accepts connections and never answers takes the
// email channel's sends only: every project's other channels go on.
func TestFairnessHungMailServer(t *testing.T) {
	tries := fairTries(t)
	h := newHarness(t)
	h.env["KLAXON_SMTP_ADDR"] = hungSMTP(t)
	h.env["KLAXON_SEND_TIMEOUT"] = "3s"
	chans := victimChannels{"webhook", "slack", "telegram"}
	victimRule := h.victimRule(chans)
	victimRule["channels"].(bson.M)["email"] = bson.M{"isEnabled": true, "endpoint": "ops@example.com", "minPeriod": 0}
	victim := h.project(victimRule)
	noisy := h.noisyProjects(10, 40, 5, "email", func(p, r int) string { return fmt.Sprintf("team-%d-%d@example.com", p, r) })
	w := h.start()
	h.publishNoisy(w, noisy)
	h.victimArrives(w, victim, chans, tries)
	w.waitMetric(t, 30*time.Second, "the mail server's circuit to open", func(v float64) bool { return v >= 1 },
		"klaxon_circuit_changes_total", "channel", "email", "state", "open")
}
