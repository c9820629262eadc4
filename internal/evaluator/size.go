package evaluator

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// What the evaluator publishes is bounded, so that no event's firings can
// make a message the broker refuses: a refused publish fails the whole
// batch, and the batch, tried again, fails again, holding every project's
// events behind it. The firings of one event on one destination go in as
// many jobs as it takes to keep each within the bound (wire.MaxJobBytes,
// or the broker's max_message_size once a refusal told it, if smaller). A
// firing too big alone goes to <prefix>.failed, cut down to what
// identifies it, and the rest of the batch goes on.
//
// Parts keep exactly once: each firing is claimed and recorded under its
// own key whichever job carries it (docs/contract.md §5.8), and a part's
// message id derives from the ids of the firings in it, so the same
// firings make the same parts with the same ids.

// tooBig is a firing that could not fit in a job of its own.
type tooBig struct {
	job  wire.Job // the firing's own job, of it alone
	size int      // its bytes as JSON
}

// pack turns the firings of one event on one destination (base names it)
// into delivery jobs of at most limit bytes each, in the rules' order, and
// returns those of the firings too big for any.
func (e *Evaluator) pack(base wire.Job, firings []wire.Firing, limit int) ([]queue.Message, []tooBig, error) {
	all := withFirings(base, firings)
	whole, err := all.Message(e.DeliveryQueue)
	if err != nil || len(whole.Body) <= limit {
		return []queue.Message{whole}, nil, err
	}
	// A job is base with its firings appended: its size is theirs plus
	// base's, exactly, so the firings' sizes say where to cut.
	head, err := json.Marshal(&base)
	if err != nil {
		return nil, nil, fmt.Errorf("encode delivery job: %w", err)
	}
	overhead := len(head) + len(`,"firings":[]`)
	var (
		msgs []queue.Message
		big  []tooBig
		part []wire.Firing
		size = overhead
	)
	flush := func() error {
		if len(part) == 0 {
			return nil
		}
		job := withFirings(base, part)
		msg, err := job.Message(e.DeliveryQueue)
		if err != nil {
			return err
		}
		if len(msg.Body) > limit { // a firing alone, bigger than any job may be
			big = append(big, tooBig{job: job, size: len(msg.Body)})
		} else {
			msgs = append(msgs, msg)
		}
		part, size = nil, overhead
		return nil
	}
	for _, f := range firings {
		b, err := json.Marshal(&f)
		if err != nil {
			return nil, nil, fmt.Errorf("encode delivery job: %w", err)
		}
		if len(part) > 0 && size+1+len(b) > limit {
			if err := flush(); err != nil {
				return nil, nil, err
			}
		}
		if len(part) > 0 {
			size++ // the comma
		}
		part, size = append(part, f), size+len(b)
	}
	if err := flush(); err != nil {
		return nil, nil, err
	}
	return msgs, big, nil
}

// withFirings is the job of firings on base's destination.
func withFirings(base wire.Job, firings []wire.Firing) wire.Job {
	base.Firings = firings
	return base
}

// failedField is how much of each text a too-big firing's record keeps:
// enough to tell the rule, project and event.
const failedField = 256

// failed is the record in <prefix>.failed of a firing too big to deliver,
// in the shape the deliverer gives a notification that failed for good
// (docs/contract.md §6), each of its texts cut to failedField bytes.
func (e *Evaluator) failed(t tooBig, limit int) (queue.Message, error) {
	job := t.job
	f := job.Firings[0]
	n := *f.Notification
	n.ProjectName, n.RuleID, n.RuleDescription = cut(n.ProjectName), cut(n.RuleID), cut(n.RuleDescription)
	n.Event.Title, n.Event.URL = cut(n.Event.Title), cut(n.Event.URL)
	if rep := n.Event.RepetitionID; rep != nil {
		short := cut(*rep)
		n.Event.RepetitionID = &short
	}
	if h := n.History; h != nil {
		c := *h
		c.TopFrame = cut(c.TopFrame)
		n.History = &c
	}
	f.RuleID, f.Notification = cut(f.RuleID), &n
	job.Firings = []wire.Firing{f}
	body, err := wire.FailedRecord(&job, []notify.Notification{n})
	if err != nil {
		return queue.Message{}, err
	}
	reason := fmt.Sprintf("delivery job of %d bytes is over the limit of %d bytes: not sent, texts cut to %d bytes here",
		t.size, limit, failedField)
	return queue.Message{RoutingKey: e.FailedQueue, Body: body, MessageID: wire.FiringKey(n.ID, job.Channel),
		ContentType: "application/json", Headers: amqp.Table{wire.ErrorHeader: reason}, Timestamp: time.Now()}, nil
}

// cut cuts s to failedField bytes without splitting a character.
func cut(s string) string {
	if len(s) <= failedField {
		return s
	}
	n := failedField
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// cutDeadLetters returns dead with every body over limit bytes cut to it,
// and the header saying so: a dead letter is set aside for people to look
// at, and must not hold the batch because the broker will not take it
// whole. dead itself is left as it is.
func cutDeadLetters(dead []queue.Message, limit int) []queue.Message {
	out := make([]queue.Message, len(dead))
	for i, m := range dead {
		if len(m.Body) > limit {
			headers := make(amqp.Table, len(m.Headers))
			for k, v := range m.Headers {
				headers[k] = v
			}
			headers[wire.ErrorHeader] = fmt.Sprintf("%v; body of %d bytes cut to the broker's max_message_size, %d", m.Headers[wire.ErrorHeader], len(m.Body), limit)
			m.Headers, m.Body = headers, m.Body[:limit]
		}
		out[i] = m
	}
	return out
}
