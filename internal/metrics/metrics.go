// Package metrics defines Klaxon's Prometheus metrics. main builds one
// Metrics on a registry and hands it to every stage.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are every metric Klaxon exports.
type Metrics struct {
	// Events by outcome: counted, duplicate, unmatched (no rule matched),
	// no_rules (project without rules), dead (dead-lettered).
	Events *prometheus.CounterVec
	// RulesEvaluated counts (event, rule) pairs sent to the counter.
	RulesEvaluated prometheus.Counter
	// RulesStarved counts (event, rule) pairs the rule could not count
	// for a field the event lacks, by reason: no_user (a countBy users
	// rule, an event without event.user).
	RulesStarved *prometheus.CounterVec
	// ProjectsOverGroupCap is how many projects this worker found over
	// KLAXON_MAX_GROUPS_PER_PROJECT live groups (internal/livegroups).
	ProjectsOverGroupCap prometheus.Gauge
	// OverflowEvents counts events of full projects counted under the
	// overflow group, for want of a state of their own.
	OverflowEvents prometheus.Counter
	// Firings by type (new, threshold).
	Firings *prometheus.CounterVec
	// Notifications by channel and outcome: sent, digested, retried,
	// throttled (paced to the provider's rate limit), deferred (its
	// destination or project had every send it may have in flight),
	// parked (its destination's circuit was open), failed, duplicate,
	// omitted, snoozed (held back by klaxon snooze; the summary at its
	// end counts as sent), quiet (held in quiet hours; the recap at their
	// end counts as sent). Sent counts messages: a digest, or an event's
	// grouped message, counts once; the others count firings.
	Notifications *prometheus.CounterVec
	// EndpointsUnopened counts delivery jobs whose sealed endpoint did not
	// open (a key no longer in KLAXON_ENDPOINT_KEY, or an altered value),
	// by channel; each also fails for good.
	EndpointsUnopened *prometheus.CounterVec
	// HawkTasks counts, with KLAXON_OUTPUT=hawk-senders, the firings
	// handed to Hawk's sender workers (published) and those left out
	// because Hawk's senders cannot render them (storm_over; omitted, a
	// full digest's firings it does not list), by channel and outcome.
	HawkTasks *prometheus.CounterVec
	// CircuitChanges counts destinations' circuits changing state, by
	// channel and new state (open, half_open, closed).
	CircuitChanges *prometheus.CounterVec
	// CircuitsOpen is how many destinations' circuits are not closed.
	CircuitsOpen *prometheus.GaugeVec
	// DeliveryLatency is from firing to the provider's acceptance, by channel.
	DeliveryLatency *prometheus.HistogramVec
	// EventLag is how old an event with a timestamp is when counted.
	EventLag prometheus.Histogram
	// QueueDepth is the number of messages ready in each queue Klaxon reads.
	QueueDepth *prometheus.GaugeVec
	// Consuming is 1 while the worker consumes a queue, by queue: with
	// several incoming queues, the one that is deleted or refused shows 0
	// while the others go on.
	Consuming *prometheus.GaugeVec
	// Batches by stage and outcome (ok, error): a handler error holds the
	// batch and retries it after a backoff.
	Batches *prometheus.CounterVec
	// BatchHeld is, by stage, how long the oldest batch the stage holds
	// for a retry has been held (0 when none): a stage that cannot get
	// past a batch shows a growing age (KLAXON_MAX_BATCH_HOLD).
	BatchHeld *prometheus.GaugeVec
	// Storms by outcome: started, over (its message published), dropped
	// (its rule or window gone), error (a check that failed and is tried
	// again).
	Storms *prometheus.CounterVec
	// HeldBytes is the bytes of messages a consumer holds unacked, by
	// queue; ConsumerPauses counts the times it stopped consuming because
	// they passed KLAXON_MAX_HELD_BYTES.
	HeldBytes      *prometheus.GaugeVec
	ConsumerPauses *prometheus.CounterVec
	// RuleLoads by source outcome (ok, error); on error the last good rules serve.
	RuleLoads *prometheus.CounterVec
	// RuleWarnings counts malformed or suspicious rules seen at load.
	RuleWarnings prometheus.Counter
	// Up is 1 while a dependency answers, by name (amqp, redis, rules).
	Up *prometheus.GaugeVec
	// OperatorAlerts counts the messages of the operator channel
	// (internal/watchdog) by state: delayed, failing, recovered, and error
	// for one that could not be sent.
	OperatorAlerts *prometheus.CounterVec
}

// durationBuckets span 10 ms to 31 days, at most 3× apart. Both histograms
// need the long end: a notification is delivered after up to 17 min of
// retries, or gathered into a digest for up to minPeriod (rules allow 31
// days); an event counted from a backlog after an outage is hours old.
func durationBuckets() []float64 {
	return []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
		1800, 3600, 7200, 21600, 43200, 86400, 259200, 604800, 1209600, 2678400}
}

// New creates the metrics and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_events_total", Help: "Incoming events by outcome.",
		}, []string{"outcome"}),
		RulesEvaluated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "klaxon_rules_evaluated_total", Help: "Event and rule pairs counted.",
		}),
		ProjectsOverGroupCap: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "klaxon_projects_over_group_cap", Help: "Projects over KLAXON_MAX_GROUPS_PER_PROJECT live groups, whose new groups are counted together.",
		}),
		OverflowEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "klaxon_overflow_events_total", Help: "Events of projects over their live groups counted under the overflow group.",
		}),
		RulesStarved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_rules_starved_total", Help: "Event and rule pairs the rule could not count for a field the event lacks, by reason.",
		}, []string{"reason"}),
		Firings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_firings_total", Help: "Rule firings by type.",
		}, []string{"type"}),
		Notifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_notifications_total", Help: "Notification deliveries by channel and outcome.",
		}, []string{"channel", "outcome"}),
		EndpointsUnopened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_endpoints_unopened_total", Help: "Delivery jobs whose sealed endpoint did not open, by channel; each failed for good.",
		}, []string{"channel"}),
		HawkTasks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_hawk_tasks_total", Help: "Firings handed to Hawk's sender workers (published) or left out (storm_over, omitted), by channel and outcome.",
		}, []string{"channel", "outcome"}),
		CircuitChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_circuit_changes_total", Help: "Destination circuits changing state, by channel and new state.",
		}, []string{"channel", "state"}),
		CircuitsOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "klaxon_circuits_open", Help: "Destinations whose circuit is open or half-open, by channel.",
		}, []string{"channel"}),
		DeliveryLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "klaxon_delivery_latency_seconds",
			Help:    "From the firing to the provider accepting the message.",
			Buckets: durationBuckets(),
		}, []string{"channel"}),
		EventLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "klaxon_event_lag_seconds",
			Help:    "Age of timestamped events when counted: how far behind the consumer is.",
			Buckets: durationBuckets(),
		}),
		QueueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "klaxon_queue_messages", Help: "Messages ready in the queues Klaxon consumes.",
		}, []string{"queue"}),
		Consuming: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "klaxon_queue_consuming", Help: "1 while the worker consumes the queue.",
		}, []string{"queue"}),
		Batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_batches_total", Help: "Handled batches by stage and outcome.",
		}, []string{"stage", "outcome"}),
		BatchHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "klaxon_batch_held_seconds", Help: "Age of the oldest batch a stage holds to retry it after a failure, 0 when none, by stage.",
		}, []string{"stage"}),
		Storms: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_storms_total", Help: "Storms tracked for \"storm over\" messages, by outcome.",
		}, []string{"outcome"}),
		HeldBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "klaxon_consumer_held_bytes", Help: "Bytes of messages a consumer holds unacknowledged, by queue.",
		}, []string{"queue"}),
		ConsumerPauses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_consumer_pauses_total", Help: "Times a consumer stopped consuming because the bytes it held passed KLAXON_MAX_HELD_BYTES, by queue.",
		}, []string{"queue"}),
		RuleLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_rule_loads_total", Help: "Rule reloads by outcome.",
		}, []string{"outcome"}),
		RuleWarnings: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "klaxon_rule_warnings_total", Help: "Malformed or suspicious rules seen when loading.",
		}),
		Up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "klaxon_dependency_up", Help: "1 while a dependency answers.",
		}, []string{"dependency"}),
		OperatorAlerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klaxon_operator_alerts_total", Help: "Messages to the operator channel about Klaxon itself, by state (delayed, failing, recovered, error).",
		}, []string{"state"}),
	}
	reg.MustRegister(m.Events, m.RulesEvaluated, m.RulesStarved, m.ProjectsOverGroupCap, m.OverflowEvents, m.Firings, m.Notifications, m.EndpointsUnopened, m.HawkTasks, m.CircuitChanges, m.CircuitsOpen, m.DeliveryLatency,
		m.EventLag, m.QueueDepth, m.Consuming, m.Batches, m.BatchHeld, m.Storms, m.HeldBytes, m.ConsumerPauses, m.RuleLoads, m.RuleWarnings, m.Up, m.OperatorAlerts)
	return m
}
