// Package webhook delivers notifications as JSON POSTs to a user's URL, in
// the format of docs/contract.md §5.1 that users code against.
package webhook

import (
	"context"
	"net/http"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// Name is the channel's name in rules and errors.
const Name = rules.Webhook

// Notifier posts messages to webhook endpoints. The zero value uses
// http.DefaultClient; deadlines come from the context of each call.
type Notifier struct {
	Client *http.Client
}

var _ notify.Channel = (*Notifier)(nil)

// New returns a Notifier using client (nil: http.DefaultClient).
func New(client *http.Client) *Notifier { return &Notifier{Client: client} }

// Notify POSTs the message to url with Content-Type application/json and
// Idempotency-Key set to the message id, so a receiver can drop the repeat
// of a message Klaxon could not know was delivered.
func (n *Notifier) Notify(ctx context.Context, url string, m *notify.Message) (retry bool, err error) {
	if err := notify.CheckMessage(m); err != nil {
		return false, err
	}
	header := http.Header{"Idempotency-Key": {m.ID}}
	return notify.PostJSON(ctx, n.Client, Name, url, header, Body(m))
}

// Body is the JSON body for m: the notification itself, a notify.Digest or
// a notify.Grouped. Lists are never null and times are UTC, so receivers
// need no special cases.
func Body(m *notify.Message) any {
	if m.Grouped {
		g := notify.Grouped{
			Version:       notify.BodyVersion,
			Type:          notify.TypeGrouped,
			ID:            m.ID,
			ProjectID:     m.ProjectID,
			ProjectName:   m.Notifications[0].ProjectName,
			RuleIDs:       make([]string, len(m.Notifications)),
			Event:         m.Notifications[0].Event,
			Notifications: make([]notify.Notification, len(m.Notifications)),
		}
		for i, n := range m.Notifications {
			g.RuleIDs[i], g.Notifications[i] = n.RuleID, normalize(n)
		}
		return g
	}
	if !m.Digest {
		n := normalize(m.Notifications[0])
		n.Version = notify.BodyVersion
		return n
	}
	d := notify.Digest{
		Version:       notify.BodyVersion,
		Type:          notify.TypeDigest,
		ID:            m.ID,
		ProjectID:     m.ProjectID,
		ProjectName:   m.Notifications[0].ProjectName,
		RuleID:        m.RuleID,
		Notifications: make([]notify.Notification, len(m.Notifications)),
		Omitted:       m.Omitted,
		Quiet:         recap(m.Quiet),
	}
	for i, n := range m.Notifications {
		d.Notifications[i] = normalize(n)
	}
	return d
}

// recap is r with its times in UTC, as every time of a body.
func recap(r *notify.Recap) *notify.Recap {
	if r == nil {
		return nil
	}
	c := *r
	c.Since, c.Until = c.Since.UTC(), c.Until.UTC()
	c.Rules = make([]notify.RecapRule, len(r.Rules))
	for i, rr := range r.Rules {
		if rr.StillAbove == nil {
			rr.StillAbove = []string{}
		}
		c.Rules[i] = rr
	}
	return &c
}

func normalize(n notify.Notification) notify.Notification {
	n.Version = "" // the body's, not each listed notification's
	n.FiredAt = n.FiredAt.UTC()
	windows := make([]notify.WindowStatus, len(n.Windows))
	for i, w := range n.Windows {
		w.ResetAt = w.ResetAt.UTC()
		windows[i] = w
	}
	n.Windows = windows
	return n
}
