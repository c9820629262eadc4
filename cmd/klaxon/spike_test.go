package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// explain of a spike window shows its count, its baseline's count, the
// usual rate and how many times that the count is, against the factor:
// what the worker's engine holds, as its messages would say it.
func TestExplainShowsASpikeWindowsBaseline(t *testing.T) {
	env, rule := redisEnvWith(t, "surge", projectA+`:
  - id: surge
    isEnabled: true
    whatToReceive: SEEN_MORE
    windows: [{threshold: 5, period: 60000, spike: {factor: 4, baseline: 3600000, floor: 2}}]
    channels:
      webhook: {isEnabled: true, endpoint: "http://127.0.0.1:9/hook", minPeriod: 0}
`)
	eng := counter.New(testenv.Redis(t), counter.Options{Prefix: env["KLAXON_PREFIX"], Verbose: true})
	// 30 events over the last half hour, then 6 in the last minute: a
	// rate of 36/60 a minute, under the floor of 2, and 6 of the 8 that
	// 4 × the floor needs.
	start := time.Now().Add(-40 * time.Minute).Truncate(time.Minute)
	var evs []counter.Event
	for i := range 36 {
		at := start.Add(time.Duration(i) * time.Minute)
		if i >= 30 {
			at = start.Add(38*time.Minute + time.Duration(i-30)*time.Second)
		}
		evs = append(evs, counter.Event{ID: fmt.Sprint("e", i), ProjectID: projectA, GroupHash: "g1", Time: at, Rules: []*rules.Rule{rule}})
	}
	res, err := eng.ObserveBatch(context.Background(), 0, evs)
	if err != nil {
		t.Fatal(err)
	}
	last := res[len(res)-1].Outcomes[0]
	if last.Fired || last.Counts[0] != 6 || last.Baseline(0) != 36 {
		t.Fatalf("the engine's last outcome %+v, want 6 unfired, baseline 36", last)
	}

	r := klaxon(t, env, "explain", "--project", projectA, "--rule", "surge", "--group", "g1", "--json")
	if r.code != exitOK {
		t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	var x explanation
	if err := json.Unmarshal([]byte(r.stdout), &x); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	w := x.State.Windows[0]
	if sp := w.Spike; w.Count != 6 || sp == nil || sp.BaselineCount != 36 || sp.Rate != 2 || sp.Ratio != 3 || sp.Factor != 4 {
		t.Errorf("window %+v, spike %+v: want count 6, baseline 36, rate 2 (the floor), ratio 3, factor 4", w, w.Spike)
	}

	r = klaxon(t, env, "explain", "--project", projectA, "--rule", "surge", "--group", "g1")
	want := "window #0  5 in 1m0s at 4× the rate over 1h0m0s: count 6 of 5, 3× the usual rate of 2 (36 events in the last 1 hour, floor 2; factor 4)"
	if r.code != exitOK || !strings.Contains(r.stdout, want) {
		t.Errorf("exit %d, output:\n%s\nwant a line %q", r.code, r.stdout, want)
	}
}

// test-send shows a spike window as just reached too: the least count that
// fires it (here 4 × the floor), at its factor times the usual rate.
func TestTestSendShowsASpikeJustReached(t *testing.T) {
	r, _, err := rules.Compile(projectA, rules.Spec{ID: "surge", IsEnabled: true, WhatToReceive: rules.SeenMore,
		Windows: []rules.WindowSpec{{Threshold: 5, Period: 60_000, Spike: &rules.SpikeSpec{Factor: 4, Baseline: 3_600_000, Floor: 2}}}})
	if err != nil {
		t.Fatal(err)
	}
	n := testNotification(r, "test-1", evaluator.Link{}, time.Now())
	w := n.Windows[0]
	if sp := w.Spike; n.Count != 8 || sp == nil || sp.BaselineCount != 120 || sp.Ratio != 4 {
		t.Errorf("count %d, spike %+v: want 8, a baseline of 120 and 4× the usual rate", n.Count, sp)
	}
}
