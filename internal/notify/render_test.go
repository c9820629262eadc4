package notify_test

import (
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
)

var firedAt = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func thresholdNotification() notify.Notification {
	rep := "rep-7"
	return notify.Notification{
		ID: "n-1", Type: notify.TypeThreshold,
		ProjectID: "5e3eef0679fa3700a0198a49", RuleID: "64ab00000000000000000001",
		Event: notify.Event{Title: "TypeError: x is undefined", GroupHash: "11dabb", RepetitionID: &rep},
		Count: 150, Threshold: 100, Period: 60_000, FiredAt: firedAt,
		Windows: []notify.WindowStatus{
			{Threshold: 100, Period: 60_000, Count: 150, ResetAt: firedAt.Add(time.Minute)},
			{Threshold: 1000, Period: 3_600_000, Count: 300, ResetAt: firedAt.Add(time.Hour)},
		},
	}
}

func TestHumanDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{time.Second, "1 second"},
		{30 * time.Second, "30 seconds"},
		{time.Minute, "1 minute"},
		{5 * time.Minute, "5 minutes"},
		{time.Hour, "1 hour"},
		{24 * time.Hour, "1 day"},
		{7 * 24 * time.Hour, "1 week"},
		{14 * 24 * time.Hour, "2 weeks"},
		{90 * time.Minute, "1 hour 30 minutes"},
		{61 * time.Second, "1 minute 1 second"},
		{36 * time.Hour, "1 day 12 hours"},
		{1500 * time.Millisecond, "1.5 seconds"},
		{0, "0 seconds"},
	} {
		if got := notify.HumanDuration(tc.d); got != tc.want {
			t.Errorf("HumanDuration(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestRenderThreshold(t *testing.T) {
	n := thresholdNotification()
	v := notify.Render(&notify.Message{ID: n.ID, ProjectID: n.ProjectID, RuleID: n.RuleID, Notifications: []notify.Notification{n}})

	if want := "TypeError: x is undefined — 150 events in the last 1 minute"; v.Subject != want {
		t.Errorf("Subject = %q, want %q", v.Subject, want)
	}
	if v.Header != "" || v.Footer != "" || len(v.Items) != 1 {
		t.Fatalf("single message rendered as %+v", v)
	}
	it := v.Items[0]
	if want := "150 events in the last 1 minute (threshold 100)"; it.Summary != want {
		t.Errorf("Summary = %q, want %q", it.Summary, want)
	}
	wantDetails := []string{
		"1 minute window: 150 of 100 events (fired), resets at 2025-01-02T03:05:05Z",
		"1 hour window: 300 of 1000 events, resets at 2025-01-02T04:04:05Z",
		"Fired at 2025-01-02T03:04:05Z",
		"Project 5e3eef0679fa3700a0198a49, rule 64ab00000000000000000001, group 11dabb, repetition rep-7",
		"Notification id n-1",
	}
	if !slices.Equal(it.Details, wantDetails) {
		t.Errorf("Details =\n%s\nwant\n%s", strings.Join(it.Details, "\n"), strings.Join(wantDetails, "\n"))
	}
	lines := v.Lines()
	if lines[0] != n.Event.Title || lines[1] != it.Summary {
		t.Errorf("Lines start %q, want title then summary", lines[:2])
	}
	if strings.Contains(v.Text(), "60000") {
		t.Errorf("text shows the period in ms:\n%s", v.Text())
	}
}

func TestRenderCountsUsers(t *testing.T) {
	n := thresholdNotification()
	n.CountBy = "users"
	n.Windows = n.Windows[:1]
	v := notify.Render(&notify.Message{Notifications: []notify.Notification{n}})
	if want := "150 users in the last 1 minute (threshold 100)"; v.Items[0].Summary != want {
		t.Errorf("Summary = %q, want %q", v.Items[0].Summary, want)
	}
	if want := "1 minute window: 150 of 100 users (fired)"; !strings.HasPrefix(v.Items[0].Details[0], want) {
		t.Errorf("window line = %q, want prefix %q", v.Items[0].Details[0], want)
	}
	n.Count, n.Threshold, n.Period = 1, 1, 30_000
	v = notify.Render(&notify.Message{Notifications: []notify.Notification{n}})
	if want := "1 user in the last 30 seconds (threshold 1)"; v.Items[0].Summary != want {
		t.Errorf("Summary = %q, want %q", v.Items[0].Summary, want)
	}
}

func TestRenderNew(t *testing.T) {
	n := notify.Notification{ID: "n-2", Type: notify.TypeNew, Count: 1, FiredAt: firedAt,
		Event: notify.Event{Title: "ReferenceError:\n  foo is not defined\tat bar"}}
	v := notify.Render(&notify.Message{Notifications: []notify.Notification{n}})
	it := v.Items[0]
	if want := "ReferenceError:   foo is not defined at bar"; it.Title != want {
		t.Errorf("Title = %q, want the title on one line %q", it.Title, want)
	}
	if want := "New event, seen for the first time"; it.Summary != want {
		t.Errorf("Summary = %q, want %q", it.Summary, want)
	}
	if !strings.HasSuffix(v.Subject, " — new event") || strings.Contains(v.Subject, "\n") {
		t.Errorf("Subject = %q", v.Subject)
	}
	for _, d := range it.Details {
		if strings.Contains(d, "window") {
			t.Errorf("new-event notification shows a window: %q", d)
		}
	}
}

func TestRenderDigest(t *testing.T) {
	a, b, c := thresholdNotification(), thresholdNotification(), thresholdNotification()
	b.Event.Title, b.Count = "RangeError: too deep", 120
	c.Type, c.Event.Title, c.Count, c.Windows = notify.TypeNew, "SyntaxError", 1, nil
	m := &notify.Message{ID: "d-1", ProjectID: a.ProjectID, RuleID: a.RuleID, Digest: true,
		Notifications: []notify.Notification{a, b, c}}
	v := notify.Render(m)

	if want := "3 notifications for rule 64ab00000000000000000001 in project 5e3eef0679fa3700a0198a49"; v.Header != want {
		t.Errorf("Header = %q, want %q", v.Header, want)
	}
	if want := "3 notifications for rule 64ab00000000000000000001: TypeError: x is undefined and 2 more"; v.Subject != want {
		t.Errorf("Subject = %q, want %q", v.Subject, want)
	}
	want := []string{
		v.Header,
		"",
		"• TypeError: x is undefined — 150 events in the last 1 minute (threshold 100), fired at 2025-01-02T03:04:05Z",
		"• RangeError: too deep — 120 events in the last 1 minute (threshold 100), fired at 2025-01-02T03:04:05Z",
		"• SyntaxError — New event, seen for the first time, fired at 2025-01-02T03:04:05Z",
		"",
		"Digest id d-1",
	}
	if got := v.Lines(); !slices.Equal(got, want) {
		t.Errorf("Lines =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestRenderDigestOfOne(t *testing.T) {
	n := thresholdNotification()
	v := notify.Render(&notify.Message{ID: "d-2", RuleID: "r", Digest: true, Notifications: []notify.Notification{n}})
	if want := "1 notification for rule r: TypeError: x is undefined"; v.Subject != want {
		t.Errorf("Subject = %q, want %q", v.Subject, want)
	}
	if lines := v.Lines(); len(lines) != 5 || !strings.HasPrefix(lines[2], "• ") {
		t.Errorf("a digest of one is still listed as a digest: %q", lines)
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"hello", 5, "hello"},
		{"hello", 4, "hel…"},
		{"héllo wörld", 3, "hé…"},
		{"", 3, ""},
		{"abc", 0, ""},
	} {
		if got := notify.Truncate(tc.s, tc.n); got != tc.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func TestCheckMessage(t *testing.T) {
	n := thresholdNotification()
	for name, m := range map[string]*notify.Message{
		"nil":                  nil,
		"empty":                {ID: "x"},
		"two without a digest": {ID: "x", Notifications: []notify.Notification{n, n}},
	} {
		if err := notify.CheckMessage(m); err == nil {
			t.Errorf("%s: CheckMessage = nil, want an error", name)
		}
	}
	if err := notify.CheckMessage(&notify.Message{ID: "x", Digest: true, Notifications: []notify.Notification{n, n}}); err != nil {
		t.Errorf("digest: %v", err)
	}
}

// Unicode format characters (category Cf) pass for nothing on screen but
// change what a reader sees: U+202E turns the rest of a line around, and
// zero-width characters split words. They come from event titles, group
// hashes and repetition ids, so every line made of those drops them.
func TestFormatCharactersAreDropped(t *testing.T) {
	const evil = "Invoice\u202Efdp.exe\u200B paid\u2066\u2069\uFEFF\u00AD"
	if got, want := notify.OneLine(evil+"\nnext"), "Invoicefdp.exe paid next"; got != want {
		t.Errorf("notify.OneLine = %q, want %q", got, want)
	}
	rep := "r\u202E1\n2"
	n := notify.Notification{ID: "n-1", Type: notify.TypeNew, ProjectID: "p", RuleID: "r", Count: 1,
		Event: notify.Event{Title: evil, GroupHash: "g\u200Dh\r\n", RepetitionID: &rep}}
	v := notify.Render(&notify.Message{ID: "n-1", Notifications: []notify.Notification{n}})
	for _, line := range append(v.Lines(), v.Subject) {
		for _, r := range line {
			if unicode.Is(unicode.Cf, r) || unicode.IsControl(r) {
				t.Errorf("line %q holds %U", line, r)
			}
		}
	}
	if !strings.Contains(v.Text(), "group gh  , repetition r1 2") {
		t.Errorf("ids line lost its content:\n%s", v.Text())
	}
}

// A message people can act on names the project, says the rule in words
// and links to the event, in a single message and in a digest.
func TestRenderProjectRuleAndLink(t *testing.T) {
	n := thresholdNotification()
	n.ProjectName, n.RuleDescription = "Shop\nfront", `100 events in 1 minute, title containing "typeerror"`
	n.Event.URL = "https://garage.hawk.so/project/5e3eef0679fa3700a0198a49/event/11dabb/overview"
	v := notify.Render(&notify.Message{ID: n.ID, ProjectID: n.ProjectID, RuleID: n.RuleID, Notifications: []notify.Notification{n}})
	if !strings.HasPrefix(v.Subject, "[Shop front] TypeError") || v.Items[0].URL != n.Event.URL {
		t.Errorf("subject %q, URL %q", v.Subject, v.Items[0].URL)
	}
	text := v.Text()
	for _, want := range []string{"View event: " + n.Event.URL, `Rule: 100 events in 1 minute, title containing "typeerror"`,
		"Project Shop front (5e3eef0679fa3700a0198a49), rule"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}

	d := notify.Render(&notify.Message{ID: "d", ProjectID: n.ProjectID, RuleID: n.RuleID, Digest: true,
		Notifications: []notify.Notification{n, n}})
	if want := `2 notifications for rule 64ab00000000000000000001 in project Shop front (5e3eef0679fa3700a0198a49): 100 events in 1 minute`; !strings.HasPrefix(d.Header, want) {
		t.Errorf("digest header %q, want it to start %q", d.Header, want)
	}
	if !strings.HasSuffix(d.Items[0].Line(), " — "+n.Event.URL) || !strings.HasPrefix(d.Subject, "[Shop front] ") {
		t.Errorf("digest line %q, subject %q", d.Items[0].Line(), d.Subject)
	}

	// Without a name, a description or a URL, nothing is left dangling.
	plain := notify.Render(&notify.Message{ID: "n", Notifications: []notify.Notification{thresholdNotification()}})
	if text := plain.Text(); strings.Contains(text, "View event") || strings.Contains(text, "Rule:") || strings.HasPrefix(plain.Subject, "[") {
		t.Errorf("plain message:\n%s", text)
	}
}

// With Hawk's events database, a message says what Hawk's own say: how
// often and since when the group happens, on how many days, and where.
// Without it, no line hints at a lookup.
func TestRenderShowsHistoryAndRegression(t *testing.T) {
	n := thresholdNotification()
	n.Type, n.Count, n.Threshold, n.Period, n.Windows = notify.TypeRegressed, 1, 0, 0, nil
	n.ResolvedAt = firedAt.Add(-time.Hour)
	n.History = &notify.History{TotalCount: 1234, FirstSeen: firedAt.Add(-72 * time.Hour), DaysRepeated: 3, TopFrame: "app/cart.js:42\n"}
	v := notify.Render(&notify.Message{ID: n.ID, Notifications: []notify.Notification{n}})
	text := v.Text()
	for _, want := range []string{
		"Regression: seen again after it was resolved at 2025-01-02T02:04:05Z",
		"Seen 1234 times in total, first at 2024-12-30T03:04:05Z, on 3 days",
		"Top frame: app/cart.js:42",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	if !strings.Contains(v.Subject, "regressed after it was resolved") {
		t.Errorf("subject %q does not say it regressed", v.Subject)
	}

	plain := notify.Render(&notify.Message{ID: "n-1", Notifications: []notify.Notification{thresholdNotification()}}).Text()
	if strings.Contains(plain, "Seen ") || strings.Contains(plain, "Top frame") {
		t.Errorf("a notification without history shows history lines:\n%s", plain)
	}
}

// A grouped message shows the event once, then every rule that fired for
// it, named by its description (else its id), with what it saw.
func TestRenderGrouped(t *testing.T) {
	a := thresholdNotification()
	a.ProjectName, a.RuleDescription, a.Event.URL = "Shop", "100 events in 1 minute", "https://hawk.example/e/11dabb"
	b := a
	b.ID, b.RuleID, b.RuleDescription = "n-2", "64ab00000000000000000002", ""
	b.Type, b.Count, b.Windows = notify.TypeNew, 1, nil
	v := notify.Render(&notify.Message{ID: "group-9", ProjectID: a.ProjectID, Grouped: true, Notifications: []notify.Notification{a, b}})
	if want := "[Shop] TypeError: x is undefined — 2 rules fired"; v.Subject != want {
		t.Errorf("Subject = %q, want %q", v.Subject, want)
	}
	lines := v.Lines()
	want := []string{
		"2 rules fired for one event in project Shop (5e3eef0679fa3700a0198a49)",
		"",
		"TypeError: x is undefined",
		"View event: https://hawk.example/e/11dabb",
		"",
		"• 100 events in 1 minute — 150 events in the last 1 minute (threshold 100)",
	}
	if !slices.Equal(lines[:len(want)], want) {
		t.Errorf("Lines start\n%s\nwant\n%s", strings.Join(lines[:len(want)], "\n"), strings.Join(want, "\n"))
	}
	text := v.Text()
	for _, s := range []string{"• Rule 64ab00000000000000000002 — New event, seen for the first time", "Notification id n-1",
		"Notification id n-2", "rule 64ab00000000000000000001", "Message id group-9"} {
		if !strings.Contains(text, s) {
			t.Errorf("grouped text lacks %q:\n%s", s, text)
		}
	}
	if err := notify.CheckMessage(&notify.Message{ID: "x", Grouped: true, Digest: true, Notifications: []notify.Notification{a}}); err == nil {
		t.Error("a message both grouped and a digest passed CheckMessage")
	}
}

func TestRenderStormOver(t *testing.T) {
	n := thresholdNotification()
	start := firedAt.Add(-5 * time.Minute)
	n.ID, n.Type, n.Count, n.CountBy, n.Windows = "o-1", notify.TypeStormOver, 240, "events", []notify.WindowStatus{}
	n.Storm = &notify.Storm{FiringID: "n-1", StartedAt: start, QuietSince: firedAt.Add(-time.Minute),
		Duration: (4 * time.Minute).Milliseconds(), Events: 240, Exact: true}
	v := notify.Render(&notify.Message{ID: n.ID, Notifications: []notify.Notification{n}})
	text := v.Text()
	for _, want := range []string{
		"Storm over: 240 events in 4 minutes, then below 100 for 1 minute",
		"Storm from 2025-01-02T02:59:05Z to 2025-01-02T03:03:05Z: 240 events in 4 minutes",
		"Below 100 events in 1 minute since 2025-01-02T03:03:05Z",
		"Closes notification n-1", "Over at 2025-01-02T03:04:05Z", "Notification id o-1",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in\n%s", want, text)
		}
	}
	if !strings.HasSuffix(v.Subject, "— storm over: 240 events in 4 minutes") || strings.Contains(text, "Fired at") {
		t.Errorf("subject %q, text\n%s", v.Subject, text)
	}
	n.Storm.Exact = false
	text = notify.Render(&notify.Message{ID: n.ID, Notifications: []notify.Notification{n}}).Text()
	if !strings.Contains(text, "at least 240 events in at most 4 minutes") || !strings.Contains(text, "lower bound") {
		t.Errorf("an inexact storm reads\n%s", text)
	}
}

// A title is one line wherever it is shown: Unicode's own line breaks
// (U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR, U+0085 NEXT LINE,
// vertical tab, form feed) would let it forge a line of its own, such as
// "Resolved, no action needed", under Klaxon's.
func TestUnicodeLineBreaksDoNotForgeLines(t *testing.T) {
	if got, want := notify.OneLine("a\u2028b\u2029c\u0085d\u000Be\u000Cf\u202Ag"), "a b c d e fg"; got != want {
		t.Errorf("notify.OneLine = %q, want %q", got, want)
	}
	for _, m := range notifytest.Hostile(firedAt) {
		v := notify.Render(m)
		for _, line := range append(v.Lines(), v.Subject) {
			if i := strings.IndexFunc(line, func(r rune) bool {
				return unicode.In(r, unicode.Zl, unicode.Zp) || unicode.IsControl(r)
			}); i >= 0 {
				t.Errorf("message %s: line %q holds a line break at %d", m.ID, line, i)
			}
		}
	}
}

// A channel's message lists the items that fit, stops at the first that
// does not (a later shorter one is not slipped in), keeps room for its
// footer and the "more" line, and says how many it left out.
func TestFitStopsAtTheFirstItemThatDoesNotFit(t *testing.T) {
	v := notify.View{Items: []notify.Item{{Title: "aaaa"}, {Title: "bbbb"}, {Title: strings.Repeat("c", 50)}, {Title: "d"}}, Omitted: 2}
	var b strings.Builder
	b.WriteString("head")
	size := func(s string) int { return len(s) }
	// 4 of head, 10 of foot and 64 for the more line: 12 left, two items.
	shown := v.Fit(&b, 4+10+64+12, "0123456789", size, func(it notify.Item) string { return "-" + it.Title + "-" })
	if b.String() != "head-aaaa--bbbb-" || len(shown.Items) != 2 || shown.Omitted != 4 ||
		shown.More() != "… and 4 more not shown here" {
		t.Errorf("wrote %q, kept %d items, %d omitted", b.String(), len(shown.Items), shown.Omitted)
	}
}
