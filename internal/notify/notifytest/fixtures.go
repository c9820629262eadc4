package notifytest

import (
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
)

// NastyTitle has characters special to every channel's markup (HTML,
// Markdown, Slack's mrkdwn), for escaping tests.
const NastyTitle = "<b>&*_[x]"

// Threshold is a notification of a rule that fired at 150 events in a
// minute (threshold 100), for tests of the channels.
func Threshold(id, title string, firedAt time.Time) notify.Notification {
	return notify.Notification{
		ID: id, Type: notify.TypeThreshold,
		ProjectID: "5e3eef0679fa3700a0198a49", RuleID: "64ab00000000000000000001",
		Event: notify.Event{Title: title, GroupHash: "11dabb"},
		Count: 150, Threshold: 100, Period: 60_000, FiredAt: firedAt,
		Windows: []notify.WindowStatus{{Threshold: 100, Period: 60_000, Count: 150, ResetAt: firedAt.Add(time.Minute)}},
	}
}

// Single is the message of one notification.
func Single(n notify.Notification) *notify.Message {
	return &notify.Message{ID: n.ID, ProjectID: n.ProjectID, RuleID: n.RuleID, Notifications: []notify.Notification{n}}
}
