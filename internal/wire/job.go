// Package wire is what Klaxon's two stages say to each other through the
// broker: the delivery job the evaluator publishes and the deliverer
// consumes, the names of the queues both use, and the header of what they
// set aside (docs/contract.md §6). It belongs to neither stage, so that
// either can change without reaching into the other.
package wire

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/snooze"
)

// Job is one notification for one channel of a rule, or the flush of the
// digest gathered during the channel's minPeriod: the body of a message on
// the delivery queue. It carries the endpoint itself, so an edit of the rule
// after the firing does not change where the firing goes.
type Job struct {
	Channel   string `json:"channel"`
	Endpoint  string `json:"endpoint"`
	MinPeriod int64  `json:"minPeriod,omitempty"` // ms
	ProjectID string `json:"projectId"`
	RuleID    string `json:"ruleId"`
	// Notification is the firing to send; nil for a digest flush.
	Notification *notify.Notification `json:"notification,omitempty"`
	// Attempt counts the sends tried so far.
	Attempt int `json:"attempt,omitempty"`
	// Generation is, for a flush, the digest its attempts were spent on: a
	// retry finding that digest settled by another flush job counts its
	// attempts afresh on what it flushes next.
	Generation string `json:"generation,omitempty"`
	// Throttled is set once the job passed the minPeriod gate, so that a
	// retry does not queue it for a digest.
	Throttled bool `json:"throttled,omitempty"`
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

// Key identifies the job for de-duplication: a firing on a channel.
func (j *Job) Key() string { return j.Notification.ID + ":" + j.Channel }

// DecodeJob parses a delivery queue message.
func DecodeJob(body []byte) (Job, error) {
	var j Job
	if err := json.Unmarshal(body, &j); err != nil {
		return j, fmt.Errorf("delivery job is not JSON: %w", err)
	}
	if j.Channel == "" || j.Endpoint == "" || j.ProjectID == "" || j.RuleID == "" {
		return j, fmt.Errorf("delivery job lacks channel, endpoint, projectId or ruleId")
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
// each a message for queue q named by its Key: the evaluator's firings and
// the storm tracker's "storm over" messages go out the same way.
func Deliveries(q, projectID string, rule *rules.Rule, n *notify.Notification) ([]queue.Message, error) {
	msgs := make([]queue.Message, 0, len(rule.Channels))
	for _, c := range rule.Channels {
		job := Job{
			Channel: c.Name, Endpoint: c.Endpoint, MinPeriod: c.MinPeriod.Milliseconds(),
			ProjectID: projectID, RuleID: rule.ID, Notification: n,
		}
		body, err := json.Marshal(job)
		if err != nil {
			return nil, fmt.Errorf("encode delivery job: %w", err)
		}
		msgs = append(msgs, queue.Message{RoutingKey: q, Body: body, MessageID: job.Key(), ContentType: "application/json"})
	}
	return msgs, nil
}
