// Package wire is what Klaxon's two stages say to each other through the
// broker: the delivery job the evaluator publishes and the deliverer
// consumes, the names of the queues both use, and the header of what they
// set aside (docs/contract.md §6). It belongs to neither stage, so that
// either can change without reaching into the other.
package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/quiet"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/snooze"
)

// Kind is what a delivery job asks of the deliverer, which goes by it
// alone.
type Kind string

// The kinds of delivery jobs.
const (
	// KindFirings sends firings of one event to one destination: a rule's
	// firing, or the firings of several rules that share the destination
	// (docs/contract.md §5.8), each passed through its rule's minPeriod.
	KindFirings Kind = "firings"
	// KindFlush sends the digest a (rule, channel) gathered during its
	// minPeriod.
	KindFlush Kind = "flush"
	// KindSnooze sends, once a snooze ended, the summary of what it held
	// back on the channel.
	KindSnooze Kind = "snooze"
	// KindQuiet sends, once a quiet period ended, the recap of the
	// firings it held for the destination.
	KindQuiet Kind = "quiet"
)

// Job is the body of a message on the delivery queue: firings to send, the
// flush of a digest, a snooze's summary or a quiet period's recap, as Kind
// says. It carries the
// endpoint itself, so an edit of the rule after the firing does not change
// where the firing goes.
type Job struct {
	Kind      Kind   `json:"kind"`
	Channel   string `json:"channel"`
	Endpoint  string `json:"endpoint"`
	ProjectID string `json:"projectId"`
	// Firings are a firings job's firings: one, or those of one event on
	// this destination, one per rule, in the order of the project's rules.
	Firings []Firing `json:"firings,omitempty"`
	// RuleID is the rule of a flush or a snooze summary, and MinPeriod
	// (ms) the flush's; a firings job's firings name their own.
	RuleID    string `json:"ruleId,omitempty"`
	MinPeriod int64  `json:"minPeriod,omitempty"`
	// Snooze is a snooze summary's snooze (internal/deliverer/snooze.go).
	Snooze *snooze.Snooze `json:"snooze,omitempty"`
	// Quiet is a recap's quiet period (internal/deliverer/quiet.go).
	Quiet *quiet.Span `json:"quiet,omitempty"`
	// Attempt counts the sends tried so far.
	Attempt int `json:"attempt,omitempty"`
	// Generation is, for a flush, the digest its attempts were spent on: a
	// retry finding that digest settled by another flush job counts its
	// attempts afresh on what it flushes next.
	Generation string `json:"generation,omitempty"`
	// NotBefore is when a provider's Retry-After ends, set when it is longer
	// than the longest retry queue: a job back from that queue earlier waits
	// again instead of being refused again.
	NotBefore time.Time `json:"notBefore,omitzero"`
	// Paced is set when the job's turn at its provider's pace was
	// reserved (NotBefore): back at it, the job goes without asking again.
	Paced bool `json:"paced,omitempty"`
}

// MaxJobBytes is the most bytes of JSON a delivery job the evaluator
// publishes may have. The firings of one event on one destination that
// would make a bigger job go in several jobs, each within it; a single
// firing bigger than it goes to <prefix>.failed instead (cut down to what
// identifies it), with the reason in ErrorHeader. It is a quarter of the
// 2 MiB max_message_size of deploy/rabbitmq/klaxon.conf: the deliverer's
// record of a job that failed for good carries the job and its
// notifications again, about twice its size, and must fit too. Real
// firings are a few KiB: the title is cut to 1,000 bytes, a rule's filter
// words to 4 KiB, an endpoint to 2 KiB.
const MaxJobBytes = 512 << 10

// Firing is one rule's firing in a firings job, with what the deliverer
// needs to pace it on its own: the rule's minPeriod on the channel.
type Firing struct {
	RuleID       string               `json:"ruleId"`
	MinPeriod    int64                `json:"minPeriod,omitempty"` // ms
	Notification *notify.Notification `json:"notification"`
	// Gated is set once the firing passed its rule's minPeriod gate, so
	// that a retry does not gather it for a digest. It keeps the wire name
	// of earlier versions, which read it: a retry one of them takes must
	// not pass the gate again.
	Gated bool `json:"throttled,omitempty"`
	// Quiet is the quiet period the firing fell in when it was made: it
	// is held for the period's recap to its destination. Decided once, by
	// whoever made the job, so that every try of the job decides alike.
	Quiet *quiet.Span `json:"quiet,omitempty"`
}

// Key identifies a firings job's message: its firing on the channel, or
// the set of its firings on the channel. The deliverer's claims are per
// firing (FiringKey), whatever job carries it. A job without firings has
// no key ("").
func (j *Job) Key() string {
	switch len(j.Firings) {
	case 0:
		return ""
	case 1:
		return FiringKey(j.Firings[0].Notification.ID, j.Channel)
	}
	ids := make([]string, len(j.Firings))
	for i, f := range j.Firings {
		ids[i] = f.Notification.ID
	}
	return GroupID(ids) + ":" + j.Channel
}

// Rule is the rule the job is of: its one firing's, or a flush's or
// snooze summary's; "" for the firings of several rules.
func (j *Job) Rule() string {
	if len(j.Firings) == 1 {
		return j.Firings[0].RuleID
	}
	return j.RuleID
}

// FiringKey names a firing on a channel: what is sent once.
func FiringKey(id, channel string) string { return id + ":" + channel }

// GroupID is the id of a grouped message of these firings: "group-" and 32
// hex digits derived from the set of ids, so that the same firings give
// the same id, in whatever order.
func GroupID(ids []string) string {
	sorted := slices.Sorted(slices.Values(ids))
	sum := sha256.Sum256([]byte(strings.Join(sorted, "\n")))
	return "group-" + hex.EncodeToString(sum[:16])
}

// DecodeJob parses a delivery queue message, and checks it as its kind
// requires. A job of an earlier version has no kind: its shape says which
// it is (flat).
func DecodeJob(body []byte) (Job, error) {
	var f flat
	if err := json.Unmarshal(body, &f); err != nil {
		return Job{}, fmt.Errorf("delivery job is not JSON: %w", err)
	}
	if f.Kind == "" {
		if err := f.check(); err != nil {
			return Job{}, err
		}
	} else if f.Notification != nil || f.Gated {
		return Job{}, fmt.Errorf("delivery job of kind %.20q carries a notification outside its firings", f.Kind)
	}
	j := f.job()
	if j.Channel == "" || j.Endpoint == "" || j.ProjectID == "" {
		return Job{}, fmt.Errorf("delivery job lacks channel, endpoint, projectId or ruleId")
	}
	if !slices.Contains(rules.ChannelNames[:], j.Channel) {
		// Names a metric label: only the known few may get that far.
		return Job{}, fmt.Errorf("delivery job's channel %.40q is not one of %v", j.Channel, rules.ChannelNames)
	}
	var err error
	switch j.Kind {
	case KindFirings:
		err = j.checkFirings()
	case KindFlush:
		err = j.checkFlush()
	case KindSnooze:
		err = j.checkSnooze()
	case KindQuiet:
		err = j.checkQuiet()
	default:
		err = fmt.Errorf("delivery job's kind %.20q is not one of %s, %s, %s, %s", j.Kind, KindFirings, KindFlush, KindSnooze, KindQuiet)
	}
	if err != nil {
		return Job{}, err
	}
	return j, nil
}

// checkFirings checks a firings job: firings, each naming its rule and
// notification, and nothing of the other kinds.
func (j *Job) checkFirings() error {
	if len(j.Firings) == 0 {
		return fmt.Errorf("firings delivery job has no firings")
	}
	for _, f := range j.Firings {
		if f.RuleID == "" || f.Notification == nil || f.Notification.ID == "" {
			return fmt.Errorf("delivery job has a firing without ruleId or notification id")
		}
	}
	if j.Snooze != nil || j.RuleID != "" || j.Quiet != nil {
		return fmt.Errorf("firings delivery job also carries a snooze, a quiet period or a ruleId of its own")
	}
	return nil
}

// checkFlush checks a flush: its rule, and nothing of the other kinds.
func (j *Job) checkFlush() error {
	if j.RuleID == "" {
		return fmt.Errorf("delivery job lacks channel, endpoint, projectId or ruleId")
	}
	if len(j.Firings) > 0 || j.Snooze != nil || j.Quiet != nil {
		return fmt.Errorf("flush delivery job also carries firings, a snooze or a quiet period")
	}
	return nil
}

// checkSnooze checks a snooze summary: its rule and snooze, and no
// firings.
func (j *Job) checkSnooze() error {
	if j.RuleID == "" || j.Snooze == nil {
		return fmt.Errorf("snooze delivery job lacks its ruleId or snooze")
	}
	if len(j.Firings) > 0 || j.Quiet != nil {
		return fmt.Errorf("snooze delivery job also carries firings or a quiet period")
	}
	return nil
}

// checkQuiet checks a quiet recap: its period, and nothing of the other
// kinds. A recap is of a destination, not of a rule.
func (j *Job) checkQuiet() error {
	if j.Quiet == nil || j.Quiet.Until.IsZero() {
		return fmt.Errorf("quiet delivery job lacks its quiet period")
	}
	if len(j.Firings) > 0 || j.Snooze != nil || j.RuleID != "" {
		return fmt.Errorf("quiet delivery job also carries firings, a snooze or a ruleId")
	}
	return nil
}

// ParseJob parses a job as DecodeJob does, its kind told by its shape when
// it has none, but checks nothing: for the failed queue's records, which
// people may have edited, and a digest's firings (MarshalFlat).
func ParseJob(body []byte) (Job, error) {
	var f flat
	if err := json.Unmarshal(body, &f); err != nil {
		return Job{}, fmt.Errorf("delivery job is not JSON: %w", err)
	}
	return f.job(), nil
}

// flat is a job in the shape of earlier versions, which had no kind: a
// single firing at the top level (notification, with ruleId, minPeriod
// and throttled), a grouped job's firings with a ruleId of "", a flush's
// rule, a snooze. DecodeJob reads it for the jobs those versions left in
// the queues; a digest in Redis, which they read too, keeps its firings in
// it (MarshalFlat); and the failed queue keeps its records in it
// (FailedRecord), the fields docs/contract.md §6 lists for people and
// tools.
type flat struct {
	Job
	// Kind and RuleID stand in for the job's: a flat job has no kind, and
	// always a ruleId.
	Kind         Kind                 `json:"kind,omitempty"`
	RuleID       string               `json:"ruleId"`
	Notification *notify.Notification `json:"notification,omitempty"`
	Gated        bool                 `json:"throttled,omitempty"`
}

// flatten is j in the earlier shape.
func (j *Job) flatten() flat {
	f := flat{Job: *j, RuleID: j.RuleID}
	if j.Kind == KindFirings && len(j.Firings) == 1 {
		one := j.Firings[0]
		f.Job.Firings, f.Job.MinPeriod = nil, one.MinPeriod
		f.RuleID, f.Notification, f.Gated = one.RuleID, one.Notification, one.Gated
	}
	return f
}

// check checks what only the earlier shape can get wrong.
func (f *flat) check() error {
	switch {
	case len(f.Firings) > 0 && (f.Notification != nil || f.Snooze != nil):
		return fmt.Errorf("grouped delivery job also carries a notification or snooze")
	case f.Notification != nil && f.Notification.ID == "":
		return fmt.Errorf("delivery job's notification has no id")
	case f.Notification != nil && f.RuleID == "" && f.Snooze == nil:
		return fmt.Errorf("delivery job lacks channel, endpoint, projectId or ruleId")
	}
	return nil
}

// job is f as a job of its kind: when f has none, the kind its shape
// tells, as deliverers of earlier versions told it, a single firing moved
// into Firings.
func (f *flat) job() Job {
	j := f.Job
	j.Kind, j.RuleID = f.Kind, f.RuleID
	if j.Kind != "" {
		return j
	}
	switch {
	case len(j.Firings) > 0:
		j.Kind = KindFirings
	case j.Snooze != nil:
		j.Kind = KindSnooze
	case f.Notification != nil:
		j.Kind = KindFirings
		j.Firings = []Firing{{RuleID: j.RuleID, MinPeriod: j.MinPeriod, Notification: f.Notification, Gated: f.Gated}}
		j.RuleID, j.MinPeriod = "", 0
	default:
		j.Kind = KindFlush
	}
	return j
}

// MarshalFlat is j as JSON in the shape of earlier versions (flat): what a
// digest keeps of a firing, for deliverers of those versions flushing it.
func (j *Job) MarshalFlat() ([]byte, error) {
	body, err := json.Marshal(j.flatten())
	if err != nil {
		return nil, fmt.Errorf("encode delivery job: %w", err)
	}
	return body, nil
}

// FailedRecord is the body of the failed queue's message for job, which
// carried the firings ns: the job in the shape of earlier versions (flat),
// whose fields docs/contract.md §6 lists for people and tools, and ns.
func FailedRecord(job *Job, ns []notify.Notification) ([]byte, error) {
	body, err := json.Marshal(struct {
		flat
		Notifications []notify.Notification `json:"notifications,omitempty"`
	}{job.flatten(), ns})
	if err != nil {
		return nil, fmt.Errorf("encode failed job: %w", err)
	}
	return body, nil
}

// Deliveries is notification n as one delivery job per channel of rule,
// each a message for queue q named by its Key, held for the recap of
// quiet period span when not nil: how the storm tracker's "storm over"
// messages go out (the evaluator first gathers an event's firings by
// destination).
func Deliveries(q, projectID string, rule *rules.Rule, n *notify.Notification, span *quiet.Span) ([]queue.Message, error) {
	msgs := make([]queue.Message, 0, len(rule.Channels))
	for _, c := range rule.Channels {
		job := Job{Kind: KindFirings, Channel: c.Name, Endpoint: c.Endpoint, ProjectID: projectID,
			Firings: []Firing{{RuleID: rule.ID, MinPeriod: c.MinPeriod.Milliseconds(), Notification: n, Quiet: span}}}
		msg, err := job.Message(q)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, msg)
	}
	return msgs, nil
}

// Message is the job as a message for the delivery queue q.
func (j *Job) Message(q string) (queue.Message, error) {
	body, err := json.Marshal(j)
	if err != nil {
		return queue.Message{}, fmt.Errorf("encode delivery job: %w", err)
	}
	return queue.Message{RoutingKey: q, Body: body, MessageID: j.Key(), ContentType: "application/json"}, nil
}
