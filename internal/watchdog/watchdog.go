// Package watchdog alerts the operator when Klaxon itself is failing its
// users: notifications are delayed, or a channel keeps failing. It is the
// alert about alerting, so it shares nothing with the path it watches: it
// sends over HTTP itself (Webhook), never through the delivery queue,
// which may be the thing that is stuck.
//
// It looks every Interval at what the worker already knows, and at
// nothing per message:
//
//   - a watched queue is stalled when it has had messages waiting at every
//     look for Limit and their number never went down (nobody consumes,
//     or consumers fall ever further behind); the broker's message count
//     is a passive declare, so a look costs one round trip per queue;
//   - events are late when those counted since the last look were counted
//     on average more than Limit after they happened
//     (klaxon_event_lag_seconds);
//   - a channel is failing when over the last Limit it had FailuresFor
//     notifications fail for good, or a destination's circuit open at
//     every look, and sent none (a single broken endpoint among working
//     ones is its rule's owner's business, not the operator's).
//
// "Delayed" (stalled queues or late events) and each failing channel are
// incidents. The first look that sees one sends its alert, once; the
// first that no longer does sends "recovered". Workers each look for
// themselves, and agree through Redis: an alert goes only from the worker
// that creates the incident's key (SET NX, with a TTL that ends an
// incident nobody saw recover), and "recovered" only from the one that
// deletes it, so the operator gets one message of each.
package watchdog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/metrics"
)

// States of an alert, and of klaxon_operator_alerts_total.
const (
	StateDelayed   = "delayed"
	StateFailing   = "failing"
	StateRecovered = "recovered"
	stateError     = "error" // the metric's: an alert that could not be sent
)

// IncidentDelayed is the incident of stalled queues and late events; a
// failing channel's is "failing:" and the channel's name.
const IncidentDelayed = "delayed"

// FailuresFor is how many notifications of a channel that fail for good
// within Limit, with none sent, make it failing.
const FailuresFor = 3

// incidentTTL bounds an incident's key in Redis: one that no worker saw
// recover (all were stopped) ends, and is alerted afresh if it lasts.
const incidentTTL = 24 * time.Hour

// sendTimeout bounds one alert's send; the looks wait for it.
const sendTimeout = 10 * time.Second

// Alert is what the operator channel receives, as the webhook's JSON body.
type Alert struct {
	Version  string `json:"version"` // "1"
	Type     string `json:"type"`    // "operator"
	Incident string `json:"incident"`
	// State is "delayed", "failing" or "recovered".
	State string `json:"state"`
	// Summary is one line for humans; Reasons say what was seen.
	Summary string    `json:"summary"`
	Reasons []string  `json:"reasons"`
	Since   time.Time `json:"since"` // when the incident began, as this worker saw it
	At      time.Time `json:"at"`
	Worker  string    `json:"worker"`
}

// Notifier sends an alert to the operator.
type Notifier interface {
	Notify(ctx context.Context, a Alert) error
}

// Config wires a Watchdog.
type Config struct {
	// Limit is how long notifications may be held up before the operator
	// hears of it (KLAXON_OPERATOR_DELAY), and the window over which a
	// channel's failures are counted.
	Limit time.Duration
	// Interval is how often it looks; default Limit/10, from 100ms to 5s.
	Interval time.Duration
	// Queues are the queues whose waiting messages are watched; Depth
	// counts the messages ready in one.
	Queues []string
	Depth  func(ctx context.Context, queue string) (int, error)
	// Metrics are the worker's, read for event lag, notifications and
	// circuits, and counted in (OperatorAlerts).
	Metrics *metrics.Metrics
	// Redis and Prefix hold the incidents' keys, <Prefix>.operator.<incident>.
	Redis  redis.UniversalClient
	Prefix string
	// Notifier sends the alerts; Worker names this worker in them.
	Notifier Notifier
	Worker   string
	Log      *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Watchdog looks for incidents and alerts the operator; see the package
// comment.
type Watchdog struct {
	cfg    Config
	queues map[string]*queueState
	// lag's cumulative sum and count at the last look
	lagSum   float64
	lagCount uint64
	looks    []look // within Limit, oldest first, and one before
	open     map[string]time.Time
}

type queueState struct {
	since time.Time // of the current run of looks with messages waiting and none taken
	last  int
}

// look is what the channels' metrics said at one look.
type look struct {
	at       time.Time
	channels map[string]channelCounts
}

type channelCounts struct {
	sent, failed float64 // cumulative
	open         float64 // circuits now
}

// New returns a Watchdog for cfg.
func New(cfg Config) *Watchdog {
	if cfg.Interval <= 0 {
		cfg.Interval = min(max(cfg.Limit/10, 100*time.Millisecond), 5*time.Second)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	w := &Watchdog{cfg: cfg, queues: map[string]*queueState{}, open: map[string]time.Time{}}
	for _, q := range cfg.Queues {
		w.queues[q] = &queueState{}
	}
	return w
}

// Run looks every Interval until ctx ends.
func (w *Watchdog) Run(ctx context.Context) error {
	w.lagSum, w.lagCount = w.lag()
	tick := time.NewTicker(w.cfg.Interval)
	defer tick.Stop()
	for {
		w.Look(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Look looks once, and alerts or says recovered where an incident began
// or ended.
func (w *Watchdog) Look(ctx context.Context) {
	now := w.cfg.Now()
	active := map[string][]string{} // incident → reasons
	if reasons := w.delays(ctx, now); len(reasons) > 0 {
		active[IncidentDelayed] = reasons
	}
	for ch, reasons := range w.failing(now) {
		active["failing:"+ch] = reasons
	}
	for _, inc := range sortedKeys(active) {
		if _, ok := w.open[inc]; !ok {
			w.open[inc] = now
		}
		w.raise(ctx, inc, active[inc], now)
	}
	for _, inc := range sortedKeys(w.open) {
		if _, ok := active[inc]; !ok {
			w.recover(ctx, inc, now)
			delete(w.open, inc)
		}
	}
}

// delays says which queues are stalled and whether events are late.
func (w *Watchdog) delays(ctx context.Context, now time.Time) []string {
	var reasons []string
	for _, q := range w.cfg.Queues {
		st := w.queues[q]
		n, err := w.cfg.Depth(ctx, q)
		if err != nil {
			continue // the broker's own alerts say it is away; keep the run
		}
		switch {
		case n == 0:
			st.since = time.Time{}
		case st.since.IsZero() || n < st.last:
			st.since = now // waiting from now, or some were taken
		}
		st.last = n
		if !st.since.IsZero() && now.Sub(st.since) >= w.cfg.Limit {
			reasons = append(reasons, fmt.Sprintf("queue %s: %d messages waiting, none taken for %s", q, n, now.Sub(st.since).Round(time.Second)))
		}
	}
	sum, count := w.lag()
	if count > w.lagCount {
		if avg := time.Duration((sum - w.lagSum) / float64(count-w.lagCount) * float64(time.Second)); avg > w.cfg.Limit {
			reasons = append(reasons, fmt.Sprintf("events counted %s after they happened, on average (klaxon_event_lag_seconds)", avg.Round(time.Second)))
		}
	}
	w.lagSum, w.lagCount = sum, count
	return reasons
}

// lag reads klaxon_event_lag_seconds' cumulative sum and count.
func (w *Watchdog) lag() (float64, uint64) {
	var m dto.Metric
	if err := w.cfg.Metrics.EventLag.Write(&m); err != nil || m.Histogram == nil {
		return 0, 0
	}
	return m.Histogram.GetSampleSum(), m.Histogram.GetSampleCount()
}

// failing says which channels failed over the last Limit, and why.
func (w *Watchdog) failing(now time.Time) map[string][]string {
	cur := look{at: now, channels: map[string]channelCounts{}}
	collect(w.cfg.Metrics.Notifications, func(labels map[string]string, v float64) {
		c := cur.channels[labels["channel"]]
		switch labels["outcome"] {
		case "sent":
			c.sent += v
		case "failed":
			c.failed += v
		}
		cur.channels[labels["channel"]] = c
	})
	collect(w.cfg.Metrics.CircuitsOpen, func(labels map[string]string, v float64) {
		c := cur.channels[labels["channel"]]
		c.open += v
		cur.channels[labels["channel"]] = c
	})
	w.looks = append(w.looks, cur)
	// Keep the looks within Limit, and the last one before as the base.
	for len(w.looks) > 1 && now.Sub(w.looks[1].at) >= w.cfg.Limit {
		w.looks = w.looks[1:]
	}
	base := w.looks[0]
	covered := now.Sub(base.at) >= w.cfg.Limit
	out := map[string][]string{}
	for ch, c := range cur.channels {
		b := base.channels[ch]
		if c.sent > b.sent {
			continue
		}
		var reasons []string
		if failed := c.failed - b.failed; failed >= FailuresFor {
			reasons = append(reasons, fmt.Sprintf("channel %s: %.0f notifications failed for good and none was sent in %s", ch, failed, w.cfg.Limit))
		}
		openAll := covered
		for _, l := range w.looks {
			openAll = openAll && l.channels[ch].open > 0
		}
		if openAll {
			reasons = append(reasons, fmt.Sprintf("channel %s: a destination's circuit open for %s, nothing sent", ch, w.cfg.Limit))
		}
		if len(reasons) > 0 {
			out[ch] = reasons
		}
	}
	return out
}

// collect calls f with the labels and value of every series of c.
func collect(c prometheus.Collector, f func(labels map[string]string, v float64)) {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range d.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		switch {
		case d.Counter != nil:
			f(labels, d.Counter.GetValue())
		case d.Gauge != nil:
			f(labels, d.Gauge.GetValue())
		}
	}
}

func (w *Watchdog) key(incident string) string { return w.cfg.Prefix + ".operator." + incident }

// raise sends an incident's alert if no worker has: the one whose SET NX
// creates its key sends. Tried at every look while the incident lasts, so
// an incident another worker saw end, or whose alert could not be sent, is
// alerted by one that still sees it.
func (w *Watchdog) raise(ctx context.Context, incident string, reasons []string, now time.Time) {
	created, err := w.cfg.Redis.SetNX(ctx, w.key(incident), w.cfg.Worker, incidentTTL).Result()
	if err != nil || !created {
		return // another worker alerted; or Redis is away, and tried again next look
	}
	state, summary := StateDelayed, "Klaxon's notifications are delayed"
	if ch, ok := strings.CutPrefix(incident, "failing:"); ok {
		state, summary = StateFailing, "Klaxon's "+ch+" notifications keep failing"
	}
	a := w.alert(incident, state, summary, reasons, now)
	if err := w.send(ctx, a); err != nil {
		// Let the next look (this worker's or another's) try again.
		w.cfg.Redis.Del(context.WithoutCancel(ctx), w.key(incident))
		return
	}
}

// recover says an incident is over if this worker is the one that ends
// it: the one whose GETDEL finds its key.
func (w *Watchdog) recover(ctx context.Context, incident string, now time.Time) {
	err := w.cfg.Redis.GetDel(ctx, w.key(incident)).Err()
	if err != nil {
		return // redis.Nil: another worker said so, or none alerted
	}
	summary := "Klaxon's notifications flow again"
	if ch, ok := strings.CutPrefix(incident, "failing:"); ok {
		summary = "Klaxon's " + ch + " notifications are sent again"
	}
	_ = w.send(ctx, w.alert(incident, StateRecovered, summary, []string{}, now))
}

func (w *Watchdog) alert(incident, state, summary string, reasons []string, now time.Time) Alert {
	return Alert{Version: "1", Type: "operator", Incident: incident, State: state, Summary: summary,
		Reasons: reasons, Since: w.open[incident], At: now, Worker: w.cfg.Worker}
}

// send sends a and says so in the log and the metric; the error is
// handled here, and returned only for the caller to know.
func (w *Watchdog) send(ctx context.Context, a Alert) error {
	ctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	err := w.cfg.Notifier.Notify(ctx, a)
	log := w.cfg.Log.With("incident", a.Incident, "state", a.State, "reasons", a.Reasons)
	if partial := (*PartialError)(nil); errors.As(err, &partial) {
		w.cfg.Metrics.OperatorAlerts.WithLabelValues(stateError).Inc()
		log.Warn("operator alert not sent everywhere", "error", partial.Err)
		err = nil
	}
	if err != nil {
		w.cfg.Metrics.OperatorAlerts.WithLabelValues(stateError).Inc()
		log.Error("operator alert not sent", "error", err)
		return err
	}
	w.cfg.Metrics.OperatorAlerts.WithLabelValues(a.State).Inc()
	if a.State == StateRecovered {
		log.Info("operator alerted: " + a.Summary)
	} else {
		log.Warn("operator alerted: " + a.Summary)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
