package notify

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// View is a message rendered as plain text for people, before any channel's
// escaping: every string in it is raw user data plus Klaxon's wording, and a
// channel must escape each one for its own format (HTML, Slack mrkdwn).
//
// A single threshold notification reads:
//
//	Subject: [Shop] TypeError: x is undefined — 150 events in the last 1 minute
//	Items[0].Title:   TypeError: x is undefined
//	Items[0].Summary: 150 events in the last 1 minute (threshold 100)
//	Items[0].URL:     https://garage.hawk.so/project/5e3e…/event/11da…/overview
//	Items[0].Details: 1 minute window: 150 of 100 events (fired), resets at 2025-01-02T03:05:05Z
//	                  Rule: 100 events in 1 minute, title containing "typeerror"
//	                  Fired at 2025-01-02T03:04:05Z
//	                  Project Shop (5e3e…), rule 64ab…, group 11da…
//	                  Notification id 9f1c…
type View struct {
	// Subject is one line saying what happened, for an email subject or a
	// chat notification preview. Titles in it are shortened.
	Subject string
	// Header introduces a digest: "3 notifications for rule R in project
	// P". Empty for a single notification.
	Header string
	// Items has one entry per firing, oldest first as given.
	Items []Item
	// Omitted counts the firings of a digest not in Items: left out by the
	// deliverer because the digest was full, or by Limit because a channel
	// shows no more. More says it in words.
	Omitted int64
	// Footer closes a digest ("Digest id …") or a grouped message
	// ("Message id …"). Empty for a single notification.
	Footer string
	// Grouped is set for the firings of several rules for one event
	// (Message.Grouped): Title and URL are then the event's, shown once,
	// and each item is one rule's firing, headed by its Rule.
	Grouped bool
	Title   string
	URL     string
}

// Item is one firing in a View.
type Item struct {
	Title   string // the event title on one line, not shortened
	Summary string // "150 events in the last 1 minute (threshold 100)" or "New event, seen for the first time"
	// URL is the event's page in the tracker, "" when not configured.
	// Channels with links show it as one ("View event"); it is made by
	// Klaxon from the operator's template, so it is safe in a link.
	URL     string
	FiredAt string   // RFC 3339, UTC
	Details []string // one fact per line: windows, rule, times, ids
	// Rule names the rule that fired: its description, else its id.
	Rule string
}

// ViewEvent is the text of a link to the event.
const ViewEvent = "View event"

// Line is the item on one line, as a digest lists it.
func (it Item) Line() string {
	s := fmt.Sprintf("%s — %s, fired at %s", it.Title, it.Summary, it.FiredAt)
	if it.URL != "" {
		s += " — " + it.URL
	}
	return s
}

// Lines is the whole view as plain text lines: for a single notification the
// title, summary and details; for a digest the header, one line per firing
// and the footer; for a grouped message the header, the event, each rule's
// firing with its details, and the footer.
func (v View) Lines() []string {
	if v.Grouped {
		lines := []string{v.Header, "", v.Title}
		if v.URL != "" {
			lines = append(lines, ViewEvent+": "+v.URL)
		}
		for _, it := range v.Items {
			lines = append(lines, "", "• "+it.Rule+" — "+it.Summary)
			for _, d := range it.Details {
				lines = append(lines, "  "+d)
			}
		}
		if more := v.More(); more != "" {
			lines = append(lines, "", more)
		}
		return append(lines, "", v.Footer)
	}
	if v.Header == "" && len(v.Items) == 1 {
		it := v.Items[0]
		lines := []string{it.Title, it.Summary}
		if it.URL != "" {
			lines = append(lines, ViewEvent+": "+it.URL)
		}
		return append(append(lines, ""), it.Details...)
	}
	lines := []string{v.Header, ""}
	for _, it := range v.Items {
		lines = append(lines, "• "+it.Line())
	}
	if more := v.More(); more != "" {
		lines = append(lines, more)
	}
	if v.Footer != "" {
		lines = append(lines, "", v.Footer)
	}
	return lines
}

// Limit keeps at most n items, counting the rest in Omitted: the one way a
// channel shortens a digest, so that every cut says how many it left out.
func (v View) Limit(n int) View {
	if more := len(v.Items) - max(n, 0); more > 0 {
		v.Items = v.Items[: len(v.Items)-more : len(v.Items)-more]
		v.Omitted += int64(more)
	}
	return v
}

// Fit writes to b as many of v's items as fit in a message of at most max,
// each as line(it), after what b holds already and leaving room for foot
// and a line saying how many more there were, all measured by size (a
// provider's unit: runes, UTF-16 code units). It stops at the first item
// that does not fit, and returns v limited to those written (Limit), whose
// More says how many it left out.
func (v View) Fit(b *strings.Builder, max int, foot string, size func(string) int, line func(Item) string) View {
	room := max - size(foot) - moreRoom
	used, shown := size(b.String()), 0
	for _, it := range v.Items {
		l := line(it)
		n := size(l)
		if used+n > room {
			break
		}
		b.WriteString(l)
		used += n
		shown++
	}
	return v.Limit(shown)
}

// moreRoom is what Fit keeps for More's line, in any provider's unit.
const moreRoom = 64

// More is the line saying how many firings a digest does not show, or ""
// when it shows them all: "… and 12 more not shown here".
func (v View) More() string {
	if v.Omitted <= 0 {
		return ""
	}
	return fmt.Sprintf("… and %d more not shown here", v.Omitted)
}

// Text is Lines joined by newlines.
func (v View) Text() string { return strings.Join(v.Lines(), "\n") }

// CheckMessage reports whether m can be rendered and sent: a single message
// carries exactly one notification, a digest or a grouped message at least
// one, and a message is not both a digest and grouped.
func CheckMessage(m *Message) error {
	switch {
	case m == nil:
		return errors.New("nil message")
	case len(m.Notifications) == 0:
		return fmt.Errorf("message %s has no notifications", m.ID)
	case m.Digest && m.Grouped:
		return fmt.Errorf("message %s is both a digest and grouped", m.ID)
	case !m.Digest && !m.Grouped && len(m.Notifications) != 1:
		return fmt.Errorf("message %s is not a digest but has %d notifications", m.ID, len(m.Notifications))
	case m.Quiet != nil && !m.Digest:
		return fmt.Errorf("message %s is a quiet recap but not a digest", m.ID)
	}
	return nil
}

// SubjectTitle bounds how much of a title a subject line repeats.
const SubjectTitle = 150

// Render turns a message into a View. It needs no clock: every time shown
// comes from the message, so a retry renders the same text.
func Render(m *Message) View {
	var v View
	for _, n := range m.Notifications {
		v.Items = append(v.Items, renderItem(n))
	}
	var name string
	// A rule id from a rules file is free-form text, as a title is.
	ruleID := OneLine(m.RuleID)
	if len(m.Notifications) > 0 {
		name = OneLine(m.Notifications[0].ProjectName)
	}
	if m.Grouped && len(v.Items) > 0 {
		return renderGrouped(m, v, name)
	}
	if m.Quiet != nil {
		return renderRecap(m, v, name)
	}
	if !m.Digest && len(v.Items) == 1 {
		it, n := v.Items[0], m.Notifications[0]
		v.Subject = Truncate(it.Title, SubjectTitle) + " — " + ShortSummary(n)
		if name != "" {
			v.Subject = "[" + Truncate(name, projectInSubject) + "] " + v.Subject
		}
		return v
	}
	v.Omitted = max(m.Omitted, 0)
	total := int64(len(m.Notifications)) + v.Omitted
	v.Header = fmt.Sprintf("%s for rule %s in project %s", plural(total, "notification"), ruleID, project(name, m.ProjectID))
	if d := m.Notifications[0].RuleDescription; d != "" {
		v.Header += ": " + Truncate(OneLine(d), maxRuleText)
	}
	v.Subject = fmt.Sprintf("%s for rule %s", plural(total, "notification"), ruleID)
	if name != "" {
		v.Subject = "[" + Truncate(name, projectInSubject) + "] " + v.Subject
	}
	if len(v.Items) > 0 {
		v.Subject += ": " + Truncate(v.Items[0].Title, SubjectTitle)
		if more := total - 1; more > 0 {
			v.Subject += fmt.Sprintf(" and %d more", more)
		}
	}
	v.Footer = "Digest id " + m.ID
	return v
}

// renderGrouped is the view of the firings of several rules for one event:
// the event once, then each rule with what it saw.
func renderGrouped(m *Message, v View, name string) View {
	n := int64(len(v.Items))
	v.Grouped, v.Title, v.URL = true, v.Items[0].Title, v.Items[0].URL
	v.Header = fmt.Sprintf("%s fired for one event in project %s", plural(n, "rule"), project(name, m.ProjectID))
	v.Subject = Truncate(v.Title, SubjectTitle) + " — " + plural(n, "rule") + " fired"
	if name != "" {
		v.Subject = "[" + Truncate(name, projectInSubject) + "] " + v.Subject
	}
	v.Footer = "Message id " + m.ID
	return v
}

// How much of a project name a subject repeats, and of a rule's
// description a message shows.
const (
	projectInSubject = 40
	maxRuleText      = 300
)

// project names a project for people: "Shop (5e3e…)", or its id alone.
func project(name, id string) string {
	if name == "" {
		return id
	}
	return name + " (" + id + ")"
}

func renderItem(n Notification) Item {
	it := Item{
		Title:   OneLine(n.Event.Title),
		Summary: summary(n),
		URL:     OneLine(n.Event.URL),
		FiredAt: rfc3339(n.FiredAt),
		Rule:    "Rule " + OneLine(n.RuleID),
	}
	if d := OneLine(n.RuleDescription); d != "" {
		it.Rule = Truncate(d, maxRuleText)
	}
	if it.Title == "" {
		it.Title = "(untitled event)"
	}
	if n.Type == TypeThreshold {
		noun := countNoun(n)
		fired := firedWindow(n)
		for i, w := range n.Windows {
			line := fmt.Sprintf("%s window: %d of %d %s", HumanDuration(ms(w.Period)), w.Count, w.Threshold, noun)
			if fired == &n.Windows[i] {
				line += " (fired)"
			}
			if sp := w.Spike; sp != nil {
				line += ", " + SpikeDetail(sp)
			}
			if !w.ResetAt.IsZero() {
				line += ", resets at " + rfc3339(w.ResetAt)
			}
			it.Details = append(it.Details, line)
		}
	}
	if h := n.History; h != nil {
		line := fmt.Sprintf("Seen %s in total", plural(h.TotalCount, "time"))
		if !h.FirstSeen.IsZero() {
			line += ", first at " + rfc3339(h.FirstSeen)
		}
		if h.DaysRepeated > 0 {
			line += ", on " + plural(h.DaysRepeated, "day")
		}
		it.Details = append(it.Details, line)
		if h.TopFrame != "" {
			// The frame comes from the event, as the title.
			it.Details = append(it.Details, "Top frame: "+Truncate(OneLine(h.TopFrame), maxRuleText))
		}
	}
	if n.RuleDescription != "" {
		it.Details = append(it.Details, "Rule: "+Truncate(OneLine(n.RuleDescription), maxRuleText))
	}
	if st := n.Storm; n.Type == TypeStormOver && st != nil {
		it.Details = append(it.Details,
			fmt.Sprintf("Storm from %s to %s: %s", rfc3339(st.StartedAt), rfc3339(st.QuietSince), stormSize(n)),
			fmt.Sprintf("Below %d %s in %s since %s", n.Threshold, countNoun(Notification{Count: 2, CountBy: n.CountBy}), HumanDuration(ms(n.Period)), rfc3339(st.QuietSince)),
			"Closes notification "+st.FiringID)
		if !st.Exact {
			it.Details = append(it.Details, "A check came late (an outage): the count is a lower bound, the duration an upper bound")
		}
		it.Details = append(it.Details, "Over at "+it.FiredAt)
	} else {
		it.Details = append(it.Details, "Fired at "+it.FiredAt)
	}
	ids := fmt.Sprintf("Project %s, rule %s, group %s", project(OneLine(n.ProjectName), n.ProjectID), n.RuleID, n.Event.GroupHash)
	if n.Event.RepetitionID != nil && *n.Event.RepetitionID != "" {
		ids += ", repetition " + *n.Event.RepetitionID
	}
	// The group hash and repetition id come from the event, as the title.
	it.Details = append(it.Details, OneLine(ids), "Notification id "+n.ID)
	return it
}

// summary says what fired: "150 events in the last 1 minute (threshold 100)".
func summary(n Notification) string {
	switch n.Type {
	case TypeNew:
		return "New event, seen for the first time"
	case TypeRegressed:
		s := "Regression: seen again after it was resolved"
		if !n.ResolvedAt.IsZero() {
			s += " at " + rfc3339(n.ResolvedAt)
		}
		return s
	}
	if n.Type == TypeStormOver && n.Storm != nil {
		return fmt.Sprintf("Storm over: %s, then below %d for %s", stormSize(n), n.Threshold, HumanDuration(ms(n.Period)))
	}
	if w := firedWindow(n); w != nil && w.Spike != nil {
		return fmt.Sprintf("%s (threshold %d, factor %s)", ShortSummary(n), n.Threshold, number(w.Spike.Factor))
	}
	return fmt.Sprintf("%s (threshold %d)", ShortSummary(n), n.Threshold)
}

// firedWindow is the window that fired: the first whose threshold and
// period are the notification's (only that one is marked); nil when none
// is.
func firedWindow(n Notification) *WindowStatus {
	for i, w := range n.Windows {
		if w.Period == n.Period && w.Threshold == n.Threshold {
			return &n.Windows[i]
		}
	}
	return nil
}

// SpikeDetail says what a spike window's baseline said: "7× the usual
// rate of 7.4 (2130 events in the last 1 day, floor 1; factor 5)".
func SpikeDetail(sp *Spike) string {
	base := plural(sp.BaselineCount, "event") + " in the last " + HumanDuration(ms(sp.Baseline))
	if sp.Floor > 0 {
		base += ", floor " + strconv.FormatInt(sp.Floor, 10)
	}
	if sp.Rate <= 0 {
		return fmt.Sprintf("no usual rate yet (%s; factor %s)", base, number(sp.Factor))
	}
	return fmt.Sprintf("%s the usual rate of %s (%s; factor %s)", Times(sp.Ratio), number(math.Round(sp.Rate*100)/100), base, number(sp.Factor))
}

// Times says a ratio as messages do: "7×", "5.5×", "288×", rounded down
// (to a tenth below 10), so that it never says more than it was.
func Times(x float64) string {
	if x < 10 {
		return number(math.Floor(x*10)/10) + "×"
	}
	return number(math.Floor(x)) + "×"
}

// number is f in the fewest digits that say it: "5", "2.5".
func number(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// stormSize says how big a storm was: "240 events in 3 minutes 20
// seconds", with "at least" and "at most" when a check came late.
func stormSize(n Notification) string {
	st := n.Storm
	if st.Exact {
		return fmt.Sprintf("%d %s in %s", st.Events, countNoun(Notification{Count: st.Events, CountBy: n.CountBy}), HumanDuration(ms(st.Duration)))
	}
	return fmt.Sprintf("at least %d %s in at most %s", st.Events, countNoun(Notification{Count: st.Events, CountBy: n.CountBy}), HumanDuration(ms(st.Duration)))
}

// ShortSummary says what fired in a few words, as a subject line does:
// "150 events in the last 1 minute", "new event".
func ShortSummary(n Notification) string {
	switch n.Type {
	case TypeNew:
		return "new event"
	case TypeRegressed:
		return "regressed after it was resolved"
	case TypeStormOver:
		if n.Storm != nil {
			return "storm over: " + stormSize(n)
		}
		return "storm over"
	}
	s := fmt.Sprintf("%d %s", n.Count, countNoun(n))
	if n.Period > 0 {
		s += " in the last " + HumanDuration(ms(n.Period))
	}
	if w := firedWindow(n); w != nil && w.Spike != nil && w.Spike.Rate > 0 {
		s += ", " + Times(w.Spike.Ratio) + " the usual rate"
	}
	return s
}

// countNoun is what a threshold counted, in agreement with its count.
func countNoun(n Notification) string {
	noun := "event"
	if n.CountBy == "users" {
		noun = "user"
	}
	if n.Count != 1 {
		noun += "s"
	}
	return noun
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.FormatInt(n, 10) + " " + noun + "s"
}

// HumanDuration says d in words, exactly, largest unit first: "1 second",
// "30 seconds", "1 minute", "1 hour 30 minutes", "1 day", "2 weeks",
// "1.5 seconds". Sub-millisecond parts are rounded away.
func HumanDuration(d time.Duration) string {
	if d < 0 {
		return "-" + HumanDuration(-d)
	}
	d = d.Round(time.Millisecond)
	if d == 0 {
		return "0 seconds"
	}
	units := []struct {
		size time.Duration
		name string
	}{
		{7 * 24 * time.Hour, "week"},
		{24 * time.Hour, "day"},
		{time.Hour, "hour"},
		{time.Minute, "minute"},
	}
	var parts []string
	for _, u := range units {
		if d >= u.size {
			parts = append(parts, plural(int64(d/u.size), u.name))
			d %= u.size
		}
	}
	switch {
	case d == 0:
	case d%time.Second == 0:
		parts = append(parts, plural(int64(d/time.Second), "second"))
	default:
		// "1.5 seconds": fractions read as plural.
		parts = append(parts, strconv.FormatFloat(d.Seconds(), 'f', -1, 64)+" seconds")
	}
	return strings.Join(parts, " ")
}

// OneLine turns line breaks and control characters into spaces, drops
// format characters (Unicode category Cf: U+202E RIGHT-TO-LEFT OVERRIDE and
// the other bidi controls, zero-width spaces and joiners, soft hyphens) and
// trims, so a multi-line error title fits a header or subject line and
// shows what it says: a bidi override in a title can make "exe.txt" read
// "txt.exe", and zero-width characters hide words from a reader. The line
// breaks are every one Unicode has: the controls (\n, \r, U+000B vertical
// tab, U+000C form feed, U+0085 NEXT LINE, tabs) and U+2028 LINE SEPARATOR
// and U+2029 PARAGRAPH SEPARATOR (categories Zl and Zp), which chat clients
// and browsers show as a new line: a title must not forge a line of its
// own under Klaxon's.
func OneLine(s string) string {
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		switch {
		case unicode.IsControl(r), unicode.In(r, unicode.Zl, unicode.Zp):
			return ' '
		case unicode.Is(unicode.Cf, r):
			return -1
		}
		return r
	}, s))
}

// Unmention puts a zero-width space after every @ in s, so that no chat
// reads a mention (@channel, @all, @here, @someone) in text that came from
// an event or a rule: Mattermost and Loop notify on such a word anywhere in
// a post, a backslash before it included; Telegram notifies the member of a
// group an @username names; Slack links names when a webhook parses them.
// The text reads the same. Channels apply it last, after OneLine, which
// would drop the zero-width space.
func Unmention(s string) string { return strings.ReplaceAll(s, "@", "@\u200B") }

// Truncate shortens s to at most n runes, ending with "…" when cut. Cut
// before escaping, so no entity is split.
func Truncate(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
