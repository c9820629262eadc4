package notify

import (
	"fmt"
	"strings"
	"time"
)

// Recap is what a quiet period's recap says of the firings the period held
// for one destination (docs/contract.md §5.9). Its message is a digest
// (Message.Digest) of those firings, with this on top.
type Recap struct {
	// Since and Until are the quiet period's start and end, in its zone.
	Since    time.Time `json:"since"`
	Until    time.Time `json:"until"`
	Timezone string    `json:"timezone"`
	// Firings is how many firings the period held, listed or omitted.
	Firings int64 `json:"firings"`
	// Rules are the rules that fired, most firings first.
	Rules []RecapRule `json:"rules"`
	// StillAbove is how many of the groups the listed firings name were
	// still at a threshold of their rule when the period ended.
	StillAbove int `json:"stillAbove"`
}

// RecapRule is one rule's part in a recap.
type RecapRule struct {
	RuleID  string `json:"ruleId"`
	Firings int64  `json:"firings"`
	// StillAbove are the groups of the rule still at one of its
	// thresholds when the period ended; never null.
	StillAbove []string `json:"stillAbove"`
}

// How much of a recap the text of a message names: rules, and groups
// still above a threshold per rule.
const (
	recapRules  = 10
	recapGroups = 3
	recapRuleID = 60
)

// RecapSummary says a recap in a few words, Klaxon's own and numbers only:
// "While quiet: 3 rules fired 5 times; 1 group still above its threshold".
func RecapSummary(r *Recap) string {
	s := fmt.Sprintf("While quiet: %s fired %s", plural(int64(len(r.Rules)), "rule"), times(r.Firings))
	if r.StillAbove > 0 {
		s += fmt.Sprintf("; %s still above threshold", plural(int64(r.StillAbove), "group"))
	}
	return s
}

func times(n int64) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}

// renderRecap is the view of a quiet period's recap: a digest whose
// header says the period and each rule's part, its items naming their rule
// when there are several.
func renderRecap(m *Message, v View, name string) View {
	r := m.Quiet
	v.Omitted = max(m.Omitted, 0)
	v.Subject = RecapSummary(r)
	if name != "" {
		v.Subject = "[" + Truncate(name, projectInSubject) + "] " + v.Subject
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s, from %s to %s (%s), in project %s", RecapSummary(r), wallClock(r.Since), wallClock(r.Until),
		OneLine(r.Timezone), project(name, m.ProjectID))
	for i, rr := range r.Rules {
		if i == recapRules {
			fmt.Fprintf(&b, "; and %s more", plural(int64(len(r.Rules)-i), "rule"))
			break
		}
		sep := ". "
		if i > 0 {
			sep = "; "
		}
		fmt.Fprintf(&b, "%srule %s: %s", sep, Truncate(OneLine(rr.RuleID), recapRuleID), plural(rr.Firings, "firing"))
		if n := len(rr.StillAbove); n > 0 {
			groups := make([]string, 0, recapGroups)
			for _, g := range rr.StillAbove[:min(n, recapGroups)] {
				groups = append(groups, Truncate(OneLine(g), recapRuleID))
			}
			if n > recapGroups {
				groups = append(groups, "…")
			}
			fmt.Fprintf(&b, ", still above threshold: %s", strings.Join(groups, ", "))
		}
	}
	v.Header = b.String()
	if len(r.Rules) > 1 {
		for i := range v.Items {
			v.Items[i].Summary += ", rule " + Truncate(OneLine(m.Notifications[i].RuleID), recapRuleID)
		}
	}
	v.Footer = "Recap id " + m.ID
	return v
}

// wallClock is t as its zone's clock shows it, with the offset.
func wallClock(t time.Time) string { return t.Format("Mon 2006-01-02 15:04 -07:00") }
