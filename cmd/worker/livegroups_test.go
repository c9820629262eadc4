package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// A project whose groups pass KLAXON_MAX_GROUPS_PER_PROJECT gets no more
// states in Redis: its later new groups are counted together, an ONLY_NEW
// rule still tells of every one, and a threshold rule fires on their sum.
// Another project's new groups are counted each on its own.
func TestProjectOverItsGroupsCountsNewOnesTogether(t *testing.T) {
	h := newHarness(t)
	h.env["KLAXON_MAX_GROUPS_PER_PROJECT"] = "1000"
	busy := h.project(
		rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}),
		// Past the cap only: the flood's last events may be counted
		// after the project is found full, and overflow too.
		rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 3, "thresholdPeriod": 3600000, "including": bson.A{"past the cap"}, "channels": h.webhookOnly()}),
	)
	other := h.project(rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 2, "thresholdPeriod": 3600000, "channels": h.webhookOnly()}))
	w := h.start()

	var flood []message
	for i := range 1200 {
		flood = append(flood, event(busy, "Error: one of a flood", fmt.Sprintf("flood-%d", i), true))
	}
	h.publish(flood...)
	w.waitMetric(t, 60*time.Second, "the flood counted", func(v float64) bool { return v >= 1200 }, "klaxon_events_total", "outcome", "counted")
	w.waitMetric(t, 30*time.Second, "the project found over its groups", func(v float64) bool { return v == 1 }, "klaxon_projects_over_group_cap")
	h.webhookBodies(1200) // each new error told: nothing waits behind them
	states := stateKeys(t, h.prefix)
	overflowed := w.metric(t, "klaxon_overflow_events_total")

	h.publish(event(busy, "Error: past the cap 1", "past-1", true), event(busy, "Error: past the cap 2", "past-2", true),
		event(busy, "Error: past the cap 3", "past-3", true), event(other, "Error: another project's", "other-1", true),
		event(other, "Error: another project's", "other-1", false))
	bodies := h.webhookBodies(1200 + 4)[1200:]
	newOnes, thresholds := map[string]int{}, map[string]int{}
	for _, b := range bodies {
		ns := []any{b}
		if grouped, ok := b["notifications"].([]any); ok {
			ns = grouped
		}
		for _, n := range ns {
			n := n.(map[string]any)
			group := n["event"].(map[string]any)["groupHash"].(string)
			switch n["type"] {
			case "new":
				newOnes[group]++
			case "threshold":
				thresholds[group]++
			}
		}
	}
	for _, g := range []string{"past-1", "past-2", "past-3"} {
		if newOnes[g] != 1 {
			t.Errorf("new error %s told %d times, want once: %v", g, newOnes[g], newOnes)
		}
	}
	// The three new groups counted as one reach the threshold of 3 at the
	// third; another project's group reaches its own.
	if thresholds["past-3"] != 1 || thresholds["other-1"] != 1 || len(thresholds) != 2 {
		t.Errorf("threshold firings %v, want one for past-3 (the sum of the three) and one for other-1", thresholds)
	}
	w.waitMetric(t, 10*time.Second, "the overflowed events counted", func(v float64) bool { return v == overflowed+3 }, "klaxon_overflow_events_total")
	// One state for the three (the overflow group) and one for the other project's group.
	if got := stateKeys(t, h.prefix); got != states+2 {
		t.Errorf("%d counting states after three new groups past the cap and one of another project, want %d + 2", got, states)
	}
	if lines := h.logs.logLines("project over its live groups: the events of its groups without a state are counted together, as one group, until it falls below nine tenths"); len(lines) != 1 {
		t.Errorf("%d warnings of the full project, want 1", len(lines))
	}
}

// stateKeys counts the groups' counting states under prefix.
func stateKeys(t *testing.T, prefix string) int {
	t.Helper()
	rdb := testenv.Redis(t)
	n := 0
	iter := rdb.Scan(context.Background(), 0, prefix+":{*}:s", 1000).Iterator()
	for iter.Next(context.Background()) {
		n++
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
