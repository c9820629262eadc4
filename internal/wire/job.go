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
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/snooze"
)

// Job is one notification for one channel of a rule, the firings of
// several rules for one event that share a destination (Firings), or the
// flush of the digest gathered during the channel's minPeriod: the body of
// a message on the delivery queue. It carries the endpoint itself, so an
// edit of the rule after the firing does not change where the firing goes.
type Job struct {
	Channel   string `json:"channel"`
	Endpoint  string `json:"endpoint"`
	MinPeriod int64  `json:"minPeriod,omitempty"` // ms
	ProjectID string `json:"projectId"`
	// RuleID is the rule of the firing or digest; "" for a grouped job,
	// whose firings name theirs. A deliverer of an earlier version, which
	// requires it, sends a grouped job to the failed queue rather than
	// taking it for something else.
	RuleID string `json:"ruleId"`
	// Notification is the firing to send; nil for a digest flush and a
	// grouped job.
	Notification *notify.Notification `json:"notification,omitempty"`
	// Firings, for a grouped job, are the firings of one event on this
	// destination, one per rule, in the order of the project's rules.
	Firings []Firing `json:"firings,omitempty"`
	// Attempt counts the sends tried so far.
	Attempt int `json:"attempt,omitempty"`
	// Generation is, for a flush, the digest its attempts were spent on: a
	// retry finding that digest settled by another flush job counts its
	// attempts afresh on what it flushes next.
	Generation string `json:"generation,omitempty"`
	// Gated is set once the job passed the minPeriod gate, so that a
	// retry does not queue it for a digest. It keeps the wire name of
	// earlier versions, which read it: a retry one of them takes must not
	// pass the gate again.
	Gated bool `json:"throttled,omitempty"`
	// Snooze, for the job that sends a snooze's summary once it ended,
	// is that snooze (snooze.go); nil otherwise.
	Snooze *snooze.Snooze `json:"snooze,omitempty"`
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
// would make a bigger grouped job go in several jobs, each within it; a
// single firing bigger than it goes to <prefix>.failed instead (cut down
// to what identifies it), with the reason in ErrorHeader. It is a quarter
// of the 2 MiB max_message_size of deploy/rabbitmq/klaxon.conf: the
// deliverer's record of a job that failed for good carries the job and
// its notifications again, about twice its size, and must fit too. Real
// firings are a few KiB: the title is cut to 1,000 bytes, a rule's filter
// words to 4 KiB, an endpoint to 2 KiB.
const MaxJobBytes = 512 << 10

// Firing is one rule's firing in a grouped job, with what the deliverer
// needs to pace it on its own: the rule's minPeriod on the channel.
type Firing struct {
	RuleID       string               `json:"ruleId"`
	MinPeriod    int64                `json:"minPeriod,omitempty"` // ms
	Notification *notify.Notification `json:"notification"`
	// Gated is set once the firing passed its minPeriod gate (on the
	// wire as Job.Gated).
	Gated bool `json:"throttled,omitempty"`
}

// Key identifies the job's message: a firing on a channel, or, for a
// grouped job, its firings on the channel. The deliverer's claims are per
// firing (FiringKey), whatever job carries it.
func (j *Job) Key() string {
	if len(j.Firings) > 0 {
		ids := make([]string, len(j.Firings))
		for i, f := range j.Firings {
			ids[i] = f.Notification.ID
		}
		return GroupID(ids) + ":" + j.Channel
	}
	return FiringKey(j.Notification.ID, j.Channel)
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

// Single is firing i of a grouped job as a job of its own, with the
// grouped job's attempts and turn: what the deliverer claims, holds for a
// snooze and passes through the rule's minPeriod, and sends alone when it
// is the one firing left.
func (j *Job) Single(i int) Job {
	f := j.Firings[i]
	return Job{Channel: j.Channel, Endpoint: j.Endpoint, MinPeriod: f.MinPeriod, ProjectID: j.ProjectID,
		RuleID: f.RuleID, Notification: f.Notification, Gated: f.Gated,
		Attempt: j.Attempt, NotBefore: j.NotBefore, Paced: j.Paced}
}

// DecodeJob parses a delivery queue message.
func DecodeJob(body []byte) (Job, error) {
	var j Job
	if err := json.Unmarshal(body, &j); err != nil {
		return j, fmt.Errorf("delivery job is not JSON: %w", err)
	}
	if j.Channel == "" || j.Endpoint == "" || j.ProjectID == "" || j.RuleID == "" && len(j.Firings) == 0 {
		return j, fmt.Errorf("delivery job lacks channel, endpoint, projectId or ruleId")
	}
	for _, f := range j.Firings {
		if f.RuleID == "" || f.Notification == nil || f.Notification.ID == "" {
			return j, fmt.Errorf("grouped delivery job has a firing without ruleId or notification id")
		}
	}
	if len(j.Firings) > 0 && (j.Notification != nil || j.Snooze != nil) {
		return j, fmt.Errorf("grouped delivery job also carries a notification or snooze")
	}
	if !slices.Contains(rules.ChannelNames[:], j.Channel) {
		// Names a metric label: only the known few may get that far.
		return j, fmt.Errorf("delivery job's channel %.40q is not one of %v", j.Channel, rules.ChannelNames)
	}
	if j.Notification != nil && j.Notification.ID == "" {
		return j, fmt.Errorf("delivery job's notification has no id")
	}
	return j, nil
}

// Deliveries is notification n as one delivery job per channel of rule,
// each a message for queue q named by its Key: how the storm tracker's
// "storm over" messages go out (the evaluator first gathers an event's
// firings by destination).
func Deliveries(q, projectID string, rule *rules.Rule, n *notify.Notification) ([]queue.Message, error) {
	msgs := make([]queue.Message, 0, len(rule.Channels))
	for _, c := range rule.Channels {
		job := Job{
			Channel: c.Name, Endpoint: c.Endpoint, MinPeriod: c.MinPeriod.Milliseconds(),
			ProjectID: projectID, RuleID: rule.ID, Notification: n,
		}
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
