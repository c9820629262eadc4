package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// A spike rule in a Hawk project — "15 in a minute, and 5× the last hour's
// rate, at least 5 a minute" — under a busy group (20 a minute for 65
// minutes, then 200 in 50 seconds) and a quiet one (one event every ten
// minutes, then 30 in 30 seconds) fires through the whole worker for the
// quiet group's spike and the busy group's burst, never for the busy
// group's usual volume, exactly as the Go model says; and the body says
// how far over the usual rate each was.
func TestSpikeRuleFiresForTheQuietGroupsSpike(t *testing.T) {
	h := newHarness(t)
	id := bson.NewObjectID()
	project := h.project(rule(bson.M{"_id": id, "whatToReceive": "SEEN_MORE", "channels": h.webhookOnly(),
		"windows": bson.A{bson.M{"threshold": 15, "period": 60000,
			"spike": bson.M{"factor": 5, "baseline": 3600000, "floor": 5}}}}))
	spec, _, err := rules.Compile(project, rules.Spec{ID: id.Hex(), IsEnabled: true, WhatToReceive: rules.SeenMore,
		Windows: []rules.WindowSpec{{Threshold: 15, Period: 60_000, Spike: &rules.SpikeSpec{Factor: 5, Baseline: 3_600_000, Floor: 5}}}})
	if err != nil {
		t.Fatal(err)
	}

	// Timestamps in quarter seconds, which a float64 holds exactly.
	start := time.Now().Add(-70 * time.Minute).Truncate(time.Second)
	type occurrence struct {
		group string
		at    time.Duration
	}
	var occ []occurrence
	const steady = 65 * time.Minute
	for at := time.Duration(0); at < steady; at += 3 * time.Second {
		occ = append(occ, occurrence{"busy", at})
		if at%(10*time.Minute) == 0 {
			occ = append(occ, occurrence{"quiet", at})
		}
	}
	for i := range 30 {
		occ = append(occ, occurrence{"quiet", steady + time.Duration(i)*time.Second})
	}
	for i := range 200 {
		occ = append(occ, occurrence{"busy", steady + time.Minute + time.Duration(i)*250*time.Millisecond})
	}
	model := counter.NewModel()
	type firing struct {
		id, group string
		count     int64
	}
	var want []firing
	var msgs []message
	for i, o := range occ {
		at := start.Add(o.at)
		m := event(project, "DatabaseError: timeout", o.group, false, fmt.Sprintf(`"timestamp":%.2f`, float64(at.UnixMilli())/1000))
		m.ID = fmt.Sprint("m", i)
		msgs = append(msgs, m)
		res := model.Observe(counter.Event{ID: m.ID, ProjectID: project, GroupHash: o.group, Time: at, Rules: []*rules.Rule{spec}}, at)
		if out := res.Outcomes[0]; out.Fired {
			want = append(want, firing{out.ID, o.group, out.Counts[0]})
		}
	}
	if len(want) != 2 || want[0].group != "quiet" || want[1].group != "busy" {
		t.Fatalf("the model fires %+v: want the quiet group's spike, then the busy group's burst", want)
	}

	h.start()
	h.publish(msgs...)
	var got []firing
	for _, b := range h.webhookBodies(2) {
		got = append(got, firing{b["id"].(string), b["event"].(map[string]any)["groupHash"].(string), int64(b["count"].(float64))})
		sp, _ := b["windows"].([]any)[0].(map[string]any)["spike"].(map[string]any)
		if sp == nil || sp["ratio"].(float64) < 5 || sp["factor"] != 5.0 || sp["baseline"] != 3600000.0 || sp["floor"] != 5.0 {
			t.Errorf("body %v: want a spike of 5× at least", b)
		}
	}
	byID := func(a, b firing) int { return strings.Compare(a.id, b.id) }
	slices.SortFunc(got, byID)
	slices.SortFunc(want, byID)
	if !slices.Equal(got, want) {
		t.Errorf("the worker fired %+v, the model %+v", got, want)
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 2)
}
