package notify_test

import (
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
)

// A quiet period's recap says, in its subject and header, how many rules
// fired how often while quiet and how many groups are still above a
// threshold, the period in its zone's wall clock, and each rule's part;
// its items name their rule, since several rules share the message.
func TestRenderRecap(t *testing.T) {
	m := notifytest.Recap("DatabaseError: timeout", time.Date(2026, 1, 7, 23, 0, 0, 0, time.UTC))
	v := notify.Render(m)
	if want := "[Shop] While quiet: 3 rules fired 5 times; 1 group still above threshold"; v.Subject != want {
		t.Errorf("subject %q, want %q", v.Subject, want)
	}
	for _, want := range []string{
		"from Wed 2026-01-07 22:00 +01:00 to Thu 2026-01-08 07:00 +01:00 (Europe/Berlin), in project Shop (5e3eef0679fa3700a0198a49)",
		"rule 64ab00000000000000000001: 3 firings, still above threshold: 11dabb; rule 64ab00000000000000000002: 1 firing",
	} {
		if !strings.Contains(v.Header, want) {
			t.Errorf("header %q lacks %q", v.Header, want)
		}
	}
	if len(v.Items) != 3 || !strings.HasSuffix(v.Items[1].Summary, ", rule 64ab00000000000000000002") {
		t.Errorf("items %+v, want each naming its rule", v.Items)
	}
	if v.Omitted != 2 || v.Footer != "Recap id quiet-1" {
		t.Errorf("omitted %d, footer %q", v.Omitted, v.Footer)
	}
	m.Quiet = &notify.Recap{Firings: 1, Rules: []notify.RecapRule{{RuleID: "r", Firings: 1}}}
	if got := notify.RecapSummary(m.Quiet); got != "While quiet: 1 rule fired once" {
		t.Errorf("summary %q", got)
	}
}
