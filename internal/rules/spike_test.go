package rules

import (
	"math"
	"strings"
	"testing"
	"time"
)

func spikeRule(threshold, period int64, sp SpikeSpec) Spec {
	return Spec{ID: "r", IsEnabled: true, WhatToReceive: SeenMore, Channels: hook(),
		Windows: []WindowSpec{{Threshold: threshold, Period: period, Spike: &sp}}}
}

func TestCompileSpike(t *testing.T) {
	r, warnings, err := Compile("p", spikeRule(50, 300_000, SpikeSpec{Factor: 5, Baseline: 86_400_000, Floor: 1}))
	if err != nil || len(warnings) != 0 {
		t.Fatalf("err %v warnings %v", err, warnings)
	}
	want := Spike{Factor: 5, Baseline: 24 * time.Hour, Floor: 1}
	if sp := r.Windows[0].Spike; sp == nil || *sp != want {
		t.Errorf("spike %+v, want %+v", sp, want)
	}
	if r.Description != "50 events in 5 minutes at 5× the rate over 1 day" {
		t.Errorf("description %q", r.Description)
	}
	if r.Cooldown != 5*time.Minute {
		t.Errorf("cooldown %v, want the window's period, not the baseline's", r.Cooldown)
	}
	plain, _, _ := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: SeenMore, Channels: hook(),
		Windows: []WindowSpec{{Threshold: 50, Period: 300_000}}})
	other, _, _ := Compile("p", spikeRule(50, 300_000, SpikeSpec{Factor: 5, Baseline: 3_600_000, Floor: 1}))
	retuned, _, _ := Compile("p", spikeRule(80, 300_000, SpikeSpec{Factor: 2.5, Baseline: 86_400_000, Floor: 20}))
	if r.Version == plain.Version || r.Version == other.Version {
		t.Error("adding a spike or changing its baseline kept the rule's version: the counts would not start afresh")
	}
	if r.Version != retuned.Version {
		t.Error("a new factor or floor changed the rule's version: they are thresholds, and keep the counts")
	}
}

// Every bad value is an error naming the window and the field, as the
// rule's other errors do (the store adds the project and the rule).
func TestSpikeErrors(t *testing.T) {
	day := int64(86_400_000)
	for _, tc := range []struct {
		sp   SpikeSpec
		want string
	}{
		{SpikeSpec{Factor: 1, Baseline: day}, "windows[0]: spike factor 1 must be above 1 and at most 1000"},
		{SpikeSpec{Factor: 0, Baseline: day}, "spike factor 0 must be above 1"},
		{SpikeSpec{Factor: 1000.5, Baseline: day}, "spike factor 1000.5 must be above 1 and at most 1000"},
		{SpikeSpec{Factor: math.NaN(), Baseline: day}, "spike factor NaN"},
		{SpikeSpec{Factor: 5}, "spike baseline 0 ms must be longer than the window's period (300000 ms)"},
		{SpikeSpec{Factor: 5, Baseline: 300_000}, "spike baseline 300000 ms must be longer than the window's period"},
		{SpikeSpec{Factor: 5, Baseline: 32 * day}, "spike baseline 2764800000 ms is longer than 744h0m0s"},
		{SpikeSpec{Factor: 5, Baseline: day, Floor: -1}, "spike floor -1 must be from 0 to 4294967295"},
		{SpikeSpec{Factor: 5, Baseline: day, Floor: 1 << 32}, "spike floor 4294967296 must be from 0"},
		{SpikeSpec{Factor: 5, Baseline: 1_000_000}, "spike can never fire: its baseline counts the window's own events, so the baseline must be at least factor × period (1500000 ms), not 1000000 ms"},
	} {
		_, _, err := Compile("p", spikeRule(50, 300_000, tc.sp))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("spike %+v: error %v, want one containing %q", tc.sp, err, tc.want)
		}
	}
	users := spikeRule(50, 300_000, SpikeSpec{Factor: 5, Baseline: day})
	users.CountBy = CountUsers
	if _, _, err := Compile("p", users); err == nil || !strings.Contains(err.Error(), "windows[0]: spike is not supported with countBy users") {
		t.Errorf("countBy users: %v", err)
	}
	if _, _, err := Compile("p", spikeRule(50, 300_000, SpikeSpec{Factor: 5, Baseline: 1_500_000})); err != nil {
		t.Errorf("a baseline of exactly factor × period: %v", err)
	}
}

// A plain window that always fires first shadows a spike window, as it
// does a plain one; a spike window, which fires only at a spike, shadows
// nothing.
func TestSpikeShadows(t *testing.T) {
	spec := spikeRule(50, 300_000, SpikeSpec{Factor: 5, Baseline: 86_400_000})
	spec.Windows = append(spec.Windows, WindowSpec{Threshold: 40, Period: 600_000})
	_, warnings, err := Compile("p", spec)
	if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], "window 0 (50 per 5m0s) can never fire before window 1") {
		t.Errorf("a plain window shadowing a spike window: %v, %v", warnings, err)
	}
	spec = spikeRule(40, 600_000, SpikeSpec{Factor: 5, Baseline: 86_400_000})
	spec.Windows = append(spec.Windows, WindowSpec{Threshold: 50, Period: 300_000})
	if _, warnings, err := Compile("p", spec); err != nil || len(warnings) != 0 {
		t.Errorf("a spike window shadows nothing: %v, %v", warnings, err)
	}
}

// The usual rate is the baseline scaled to the window, at least the floor;
// a group with no history needs max(threshold, factor × floor).
func TestSpikeReached(t *testing.T) {
	w := Window{Threshold: 50, Period: 5 * time.Minute, Spike: &Spike{Factor: 5, Baseline: 24 * time.Hour, Floor: 20}}
	for _, tc := range []struct {
		count, base int64
		rate        float64
		want        bool
	}{
		{49, 49, 20, false},                 // under the threshold
		{99, 99, 20, false},                 // new group: under 5 × the floor
		{100, 100, 20, true},                // new group: 5 × the floor
		{100, 288 * 10, 20, true},           // 10 a window as usual, the floor above
		{149, 288*30 + 149, 30.517, false},  // 30 a window as usual: 5× is 152.6
		{153, 288*30 + 153, 30.53125, true}, // 5.01×
	} {
		if got := w.Reached(tc.count, tc.base); got != tc.want {
			t.Errorf("Reached(%d, %d) = %v, want %v", tc.count, tc.base, got, tc.want)
		}
		if got := w.Rate(tc.base); math.Abs(got-tc.rate) > 0.001 {
			t.Errorf("Rate(%d) = %v, want %v", tc.base, got, tc.rate)
		}
	}
	plain := Window{Threshold: 50, Period: time.Minute}
	if !plain.Reached(50, 0) || plain.Reached(49, 1000) || plain.Rate(1000) != 0 {
		t.Error("a plain window: its threshold alone")
	}
}
