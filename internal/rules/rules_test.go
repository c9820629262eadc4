package rules

import (
	"strings"
	"testing"
	"time"
)

func hook() map[string]ChannelSpec {
	return map[string]ChannelSpec{Webhook: {IsEnabled: true, Endpoint: "http://127.0.0.1/h", MinPeriod: 60}}
}

func TestCompileHawkRule(t *testing.T) {
	r, warnings, err := Compile("p", Spec{
		ID: "r1", IsEnabled: true, WhatToReceive: SeenMore, Threshold: 100, ThresholdPeriod: 60_000,
		Including: []string{" Database "}, Channels: map[string]ChannelSpec{
			Email:   {IsEnabled: false, Endpoint: "x@y"},
			Webhook: {IsEnabled: true, Endpoint: "http://127.0.0.1/h", MinPeriod: 60},
		},
	})
	if err != nil || len(warnings) != 0 {
		t.Fatalf("err %v warnings %v", err, warnings)
	}
	if len(r.Windows) != 1 || r.Windows[0] != (Window{Threshold: 100, Period: time.Minute}) {
		t.Errorf("windows %+v", r.Windows)
	}
	if r.Cooldown != time.Minute {
		t.Errorf("cooldown %v, want the longest period", r.Cooldown)
	}
	if len(r.Channels) != 1 || r.Channels[0].Name != Webhook || r.Channels[0].MinPeriod != time.Minute {
		t.Errorf("channels %+v", r.Channels)
	}
}

func TestDisabledRule(t *testing.T) {
	r, _, err := Compile("p", Spec{ID: "r", WhatToReceive: OnlyNew})
	if r != nil || err != nil {
		t.Errorf("disabled rule compiled to %v, %v", r, err)
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{WhatToReceive: OnlyNew}, "no id"},
		{Spec{ID: "r", WhatToReceive: "ALL"}, `whatToReceive "ALL"`},
		{Spec{ID: "r", WhatToReceive: SeenMore, Threshold: 0, ThresholdPeriod: 60_000}, "threshold 0 must be from 1 to 4294967295"},
		{Spec{ID: "r", WhatToReceive: SeenMore, Threshold: 1 << 32, ThresholdPeriod: 60_000}, "threshold 4294967296 must be from 1"},
		{Spec{ID: "r", WhatToReceive: SeenMore, Threshold: 5, ThresholdPeriod: 999}, "period 999 ms must be at least 1000"},
		{Spec{ID: "r", WhatToReceive: SeenMore, Windows: []WindowSpec{{5, 60_000}, {0, 1000}}}, "windows[1]: threshold 0"},
		{Spec{ID: "r", WhatToReceive: SeenMore, Threshold: 5, ThresholdPeriod: 60_000, CountBy: "sessions"}, `countBy "sessions"`},
		{Spec{ID: "r", WhatToReceive: SeenMore, Threshold: 5, ThresholdPeriod: 60_000, Cooldown: -1}, "cooldown -1"},
		{Spec{ID: "r", WhatToReceive: OnlyNew, Channels: map[string]ChannelSpec{Slack: {IsEnabled: true}}}, "channel slack is enabled but has no endpoint"},
	} {
		tc.spec.IsEnabled = true
		_, _, err := Compile("p", tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Compile(%+v) = %v, want error containing %q", tc.spec, err, tc.want)
		}
	}
}

func TestWarnings(t *testing.T) {
	_, warnings, err := Compile("p", Spec{
		ID: "r", IsEnabled: true, WhatToReceive: SeenMore, Channels: map[string]ChannelSpec{"pager": {IsEnabled: true, Endpoint: "x"}},
		// 5 per 3 s can never decide: 5 per minute always reaches 5 first.
		Windows: []WindowSpec{{Threshold: 5, Period: 60_000}, {Threshold: 5, Period: 3_000}, {Threshold: 3, Period: 1_000}},
	})
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(warnings, "\n")
	for _, want := range []string{"window 1 (5 per 3s) can never fire before window 0 (5 per 1m0s)", `unknown channel "pager"`, "no enabled channel"} {
		if !strings.Contains(all, want) {
			t.Errorf("warnings %q lack %q", all, want)
		}
	}
	if strings.Contains(all, "window 2") {
		t.Errorf("window 2 (3 per 1 s) can decide, but was warned about: %q", all)
	}
}

func TestMatches(t *testing.T) {
	r, _, err := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, Channels: hook(),
		Including: []string{"Database", "timeout"}, Excluding: []string{"TEST"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		title string
		isNew bool
		want  bool
	}{
		{"DATABASE down", true, true},
		{"read TIMEOUT", true, true},
		{"database down", false, false}, // ONLY_NEW
		{"TypeError", true, false},      // not included
		{"database test failed", true, false},
	} {
		if got := r.Matches(tc.title, tc.isNew); got != tc.want {
			t.Errorf("Matches(%q, %v) = %v, want %v", tc.title, tc.isNew, got, tc.want)
		}
	}
	any, _, _ := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: SeenMore, Threshold: 1, ThresholdPeriod: 1000, Channels: hook()})
	if !any.Matches("anything", false) {
		t.Error("a rule without filters must match every title")
	}
}

func TestVersionFollowsCounting(t *testing.T) {
	spec := Spec{ID: "r", IsEnabled: true, WhatToReceive: SeenMore, Threshold: 5, ThresholdPeriod: 60_000, Channels: hook()}
	a, _, _ := Compile("p", spec)
	spec.Including = []string{"x"}
	b, _, _ := Compile("p", spec)
	spec.Threshold = 50
	spec.Cooldown = 5000
	b2, _, _ := Compile("p", spec)
	spec.ThresholdPeriod = 120_000
	c, _, _ := Compile("p", spec)
	if a.Version != b.Version || a.Version != b2.Version || a.Version == c.Version {
		t.Errorf("versions %s %s %s %s: want filter, threshold and cooldown edits to keep counters and a period edit to reset them",
			a.Version, b.Version, b2.Version, c.Version)
	}
}
