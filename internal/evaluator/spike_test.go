package evaluator_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// A spike window's firing tells its baseline: the count, the usual rate
// and how far over it the window was, beside the rule's factor, baseline
// period and floor; a plain window's has no "spike".
func TestNotificationOfASpike(t *testing.T) {
	r, _, err := rules.Compile(project, rules.Spec{ID: "db-surge", IsEnabled: true, WhatToReceive: rules.SeenMore,
		Windows: []rules.WindowSpec{
			{Threshold: 1000, Period: 3_600_000},
			{Threshold: 50, Period: 300_000, Spike: &rules.SpikeSpec{Factor: 5, Baseline: 86_400_000, Floor: 1}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2025, 12, 1, 10, 0, 0, 0, time.UTC)
	// Counts: the windows', then the spike window's baseline.
	o := counter.Outcome{Rule: r, Fired: true, ID: "f1", Window: 1, Counts: []int64{300, 52, 2130}, At: at}
	ev := counter.Event{ProjectID: project, GroupHash: "g"}
	m := event.Message{ProjectID: project, Event: event.Event{Title: "DatabaseError", GroupHash: "g"}}
	n := evaluator.Notification(&ev, &m, &o)
	if n.Count != 52 || n.Windows[0].Spike != nil {
		t.Errorf("count %d, plain window's spike %+v", n.Count, n.Windows[0].Spike)
	}
	sp := n.Windows[1].Spike
	want := notify.Spike{Factor: 5, Baseline: 86_400_000, Floor: 1, BaselineCount: 2130,
		Rate: 2130 * 300_000 / 86_400_000.0, Ratio: 52 / (2130 * 300_000 / 86_400_000.0)}
	if sp == nil || *sp != want {
		t.Fatalf("spike %+v, want %+v", sp, want)
	}
	body, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `"count":52,"resetAt":"2025-12-01T10:05:05Z","spike":{"factor":5,"baseline":86400000,"floor":1,"baselineCount":2130,"rate":7.395833333333333,"ratio":7.030985915492958}}`) ||
		strings.Count(string(body), `"spike"`) != 1 {
		t.Errorf("body %s", body)
	}
	if got := notify.ShortSummary(n); got != "52 events in the last 5 minutes, 7× the usual rate" {
		t.Errorf("summary %q", got)
	}
}
