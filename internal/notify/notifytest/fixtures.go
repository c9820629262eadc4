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

// Grouped is the message of three rules of one project firing for one
// event (a threshold, a new event, a second threshold), each rule with its
// description, for tests of the channels.
func Grouped(title string, firedAt time.Time) *notify.Message {
	a := Threshold("n-a", title, firedAt)
	a.ProjectName, a.RuleDescription = "Shop", "100 events in 1 minute"
	b := a
	b.ID, b.RuleID, b.RuleDescription = "n-b", "64ab00000000000000000002", "new errors"
	b.Type, b.Count, b.Threshold, b.Period, b.Windows = notify.TypeNew, 1, 0, 0, []notify.WindowStatus{}
	c := a
	c.ID, c.RuleID, c.RuleDescription = "n-c", "64ab00000000000000000003", ""
	return &notify.Message{ID: "group-1", ProjectID: a.ProjectID, Grouped: true, Notifications: []notify.Notification{a, b, c}}
}
