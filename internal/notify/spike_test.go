package notify_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
)

// A spike window's message says how far over the usual rate it was, in
// the subject and the summary, and what the baseline held in its line.
func TestRenderSpike(t *testing.T) {
	n := thresholdNotification()
	n.Count, n.Threshold, n.Period = 52, 50, 300_000
	n.Windows = []notify.WindowStatus{
		{Threshold: 50, Period: 300_000, Count: 52, ResetAt: firedAt.Add(5 * time.Minute),
			Spike: &notify.Spike{Factor: 5, Baseline: 86_400_000, Floor: 1, BaselineCount: 2130, Rate: 7.395833333333333, Ratio: 7.030985915492958}},
		{Threshold: 1000, Period: 3_600_000, Count: 300, ResetAt: firedAt.Add(time.Hour)},
	}
	v := notify.Render(&notify.Message{ID: n.ID, ProjectID: n.ProjectID, RuleID: n.RuleID, Notifications: []notify.Notification{n}})
	if want := "TypeError: x is undefined — 52 events in the last 5 minutes, 7× the usual rate"; v.Subject != want {
		t.Errorf("Subject = %q, want %q", v.Subject, want)
	}
	it := v.Items[0]
	if want := "52 events in the last 5 minutes, 7× the usual rate (threshold 50, factor 5)"; it.Summary != want {
		t.Errorf("Summary = %q, want %q", it.Summary, want)
	}
	wantDetails := []string{
		"5 minutes window: 52 of 50 events (fired), 7× the usual rate of 7.4 (2130 events in the last 1 day, floor 1; factor 5), resets at 2025-01-02T03:09:05Z",
		"1 hour window: 300 of 1000 events, resets at 2025-01-02T04:04:05Z",
	}
	if !slices.Equal(it.Details[:2], wantDetails) {
		t.Errorf("Details =\n%s\nwant\n%s", strings.Join(it.Details[:2], "\n"), strings.Join(wantDetails, "\n"))
	}

	// A window that did not fire says its spike too, and a plain window
	// that fired says no rate.
	n.Count, n.Threshold, n.Period = 300, 1000, 3_600_000
	n.Windows[0].Spike.Ratio, n.Windows[0].Count = 2.5, 18
	it = notify.Render(&notify.Message{ID: n.ID, Notifications: []notify.Notification{n}}).Items[0]
	if want := "300 events in the last 1 hour (threshold 1000)"; it.Summary != want {
		t.Errorf("plain window fired: Summary = %q, want %q", it.Summary, want)
	}
	if want := "5 minutes window: 18 of 50 events, 2.5× the usual rate of 7.4"; !strings.HasPrefix(it.Details[0], want) {
		t.Errorf("Details[0] = %q, want it to start %q", it.Details[0], want)
	}
}

func TestTimes(t *testing.T) {
	for x, want := range map[float64]string{7.03: "7×", 5.56: "5.5×", 9.99: "9.9×", 10.7: "10×", 288: "288×", 0.17: "0.1×"} {
		if got := notify.Times(x); got != want {
			t.Errorf("Times(%v) = %q, want %q", x, got, want)
		}
	}
}
