package notifytest

import (
	"fmt"
	"regexp"
	"strings"
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

// Recap is the recap of a quiet period in Berlin that held the firings of
// Grouped's three rules, the first still above its threshold for its
// group, for tests of the channels.
func Recap(title string, firedAt time.Time) *notify.Message {
	berlin := time.FixedZone("CET", 3600)
	g := Grouped(title, firedAt)
	return &notify.Message{ID: "quiet-1", ProjectID: g.ProjectID, Digest: true, Notifications: g.Notifications,
		Omitted: 2, Quiet: &notify.Recap{
			Since: time.Date(2026, 1, 7, 22, 0, 0, 0, berlin), Until: time.Date(2026, 1, 8, 7, 0, 0, 0, berlin),
			Timezone: "Europe/Berlin", Firings: 5, StillAbove: 1,
			Rules: []notify.RecapRule{
				{RuleID: g.Notifications[0].RuleID, Firings: 3, StillAbove: []string{g.Notifications[0].Event.GroupHash}},
				{RuleID: g.Notifications[1].RuleID, Firings: 1, StillAbove: []string{}},
				{RuleID: g.Notifications[2].RuleID, Firings: 1, StillAbove: []string{}},
			}}}
}

// Hostile is a single message, a digest, a grouped message and a quiet
// recap in which
// every field that comes from an event or a rule (title, project name, rule
// id and description, group hash, top frame) tries to mention everyone in a
// chat (@channel, @all, @here, @someone, Slack's <!channel> and <@U…>) and
// to start a line of its own with a Unicode line or paragraph separator,
// for tests that a channel keeps such text inert: see Inert.
func Hostile(firedAt time.Time) []*notify.Message {
	const bad = "@channel @all\u2028@here\u2029<!channel> <!here> <@U024BE7LH> @someone\u0085x\u000By\u000Cz"
	n := Threshold("n-1", "TypeError "+bad, firedAt)
	n.ProjectName, n.RuleID, n.RuleDescription = "Shop "+bad, "rule "+bad, "rule text "+bad
	n.Event.GroupHash = "g " + bad
	n.History = &notify.History{TotalCount: 3, TopFrame: "frame " + bad}
	single := Single(n)
	digest := &notify.Message{ID: "d-1", ProjectID: n.ProjectID, RuleID: n.RuleID, Digest: true,
		Notifications: []notify.Notification{n, n}}
	grouped := Grouped("TypeError "+bad, firedAt)
	for i := range grouped.Notifications {
		g := &grouped.Notifications[i]
		g.ProjectName, g.RuleID, g.RuleDescription = n.ProjectName, n.RuleID, n.RuleDescription
	}
	recap := Recap("TypeError "+bad, firedAt)
	recap.Notifications = grouped.Notifications
	recap.Quiet.Timezone = "Europe/" + bad
	for i := range recap.Quiet.Rules {
		r := &recap.Quiet.Rules[i]
		r.RuleID, r.StillAbove = n.RuleID+fmt.Sprint(i), []string{n.Event.GroupHash}
	}
	return []*notify.Message{single, digest, grouped, recap}
}

// Inert reports what in text, a channel's rendering of a Hostile message,
// a chat could read as a mention or a line of its own: an @ directly
// before a name, "<!" or "<@" before one (Slack's mention syntax,
// unescaped, which Mattermost reads too), and the
// Unicode line breaks other than \n (U+2028, U+2029, U+0085, U+000B,
// U+000C). It returns nil when there is none.
func Inert(text string) []string {
	var found []string
	for _, m := range mention.FindAllString(text, -1) {
		found = append(found, "mention "+m)
	}
	for _, r := range "\u2028\u2029\u0085\u000B\u000C" {
		if strings.ContainsRune(text, r) {
			found = append(found, fmt.Sprintf("line break %U", r))
		}
	}
	return found
}

var mention = regexp.MustCompile(`@[\p{L}\p{N}_.\-]+|<[!@][\p{L}\p{N}^]+`)
