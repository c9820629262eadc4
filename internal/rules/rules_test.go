package rules

import (
	"slices"
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
		{Spec{ID: "r", WhatToReceive: SeenMore, Windows: []WindowSpec{{Threshold: 5, Period: 60_000}, {Threshold: 0, Period: 1000}}}, "windows[1]: threshold 0"},
		{Spec{ID: "r", WhatToReceive: SeenMore, Threshold: 5, ThresholdPeriod: 60_000, CountBy: "sessions"}, `countBy "sessions"`},
		{Spec{ID: "r", WhatToReceive: SeenMore, Threshold: 5, ThresholdPeriod: 60_000, Cooldown: -1}, "cooldown -1"},
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
	for _, want := range []string{"window 1 (5 per 3s) can never fire before window 0 (5 per 1m0s)", `channel "pager" is not supported`, "no enabled channel"} {
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

// hawkDefaultChannels are the channels hawk.api's createProject gives the
// rule it adds to every new project: email on, the others off and empty.
func hawkDefaultChannels() map[string]ChannelSpec {
	return map[string]ChannelSpec{
		Email:         {IsEnabled: true, Endpoint: "owner@example.com", MinPeriod: 60},
		Telegram:      {IsEnabled: false, Endpoint: "", MinPeriod: 60},
		Slack:         {IsEnabled: false, Endpoint: "", MinPeriod: 60},
		Loop:          {IsEnabled: false, Endpoint: "", MinPeriod: 60},
		"webPush":     {IsEnabled: false, Endpoint: "", MinPeriod: 60},
		"desktopPush": {IsEnabled: false, Endpoint: "", MinPeriod: 60},
	}
}

// Hawk's own default rule loads quietly: its disabled channels that Klaxon
// does not have (pushes) are not worth a warning on every project.
func TestHawkDefaultRuleLoadsWithoutWarnings(t *testing.T) {
	r, warnings, err := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: SeenMore,
		Threshold: 20, ThresholdPeriod: 3_600_000, Including: []string{}, Excluding: []string{}, Channels: hawkDefaultChannels()})
	if err != nil || len(warnings) != 0 {
		t.Fatalf("err %v, warnings %q: want none", err, warnings)
	}
	if len(r.Channels) != 1 || r.Channels[0].Name != Email || r.Channels[0].MinPeriod != time.Minute {
		t.Errorf("channels %+v, want email only", r.Channels)
	}
}

// A channel Klaxon does not have is warned about when it is enabled: its
// messages will not be sent.
func TestEnabledUnsupportedChannelWarned(t *testing.T) {
	channels := hawkDefaultChannels()
	channels["webPush"] = ChannelSpec{IsEnabled: true, Endpoint: "subscription-1"}
	_, warnings, err := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, Channels: channels})
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], `channel "webPush" is not supported`) {
		t.Errorf("warnings %q, want one about webPush", warnings)
	}
}

// A migrated rule whose Loop channel is on keeps notifying there: loop is
// one of Klaxon's channels, not a warning.
func TestLoopChannelCompiled(t *testing.T) {
	channels := hawkDefaultChannels()
	channels[Loop] = ChannelSpec{IsEnabled: true, Endpoint: " https://loop.example/hooks/x ", MinPeriod: 30}
	r, warnings, err := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, Channels: channels})
	if err != nil || len(warnings) != 0 {
		t.Fatalf("err %v, warnings %q: want none", err, warnings)
	}
	want := []Channel{{Name: Email, Endpoint: "owner@example.com", MinPeriod: time.Minute},
		{Name: Loop, Endpoint: "https://loop.example/hooks/x", MinPeriod: 30 * time.Second}}
	if !slices.Equal(r.Channels, want) {
		t.Errorf("channels %+v, want %+v", r.Channels, want)
	}
}

// Hawk sends each enabled channel on its own, so a rule with one enabled
// channel left without an endpoint still notifies the others; Klaxon leaves
// that channel out with a warning rather than the whole rule.
func TestEnabledChannelWithoutEndpointLeftOut(t *testing.T) {
	r, warnings, err := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, Channels: map[string]ChannelSpec{
		Email:    {IsEnabled: true, Endpoint: "ops@example.com", MinPeriod: 60},
		Telegram: {IsEnabled: true, Endpoint: " ", MinPeriod: 60},
	}})
	if err != nil {
		t.Fatalf("rule skipped: %v", err)
	}
	if len(r.Channels) != 1 || r.Channels[0].Name != Email {
		t.Errorf("channels %+v, want email only", r.Channels)
	}
	if all := strings.Join(warnings, "\n"); !strings.Contains(all, "channel telegram is enabled but has no endpoint") {
		t.Errorf("warnings %q lack the telegram one", all)
	}
}

// Hawk's telegram endpoints are hooks of CodeX's notify bot
// (https://notify.bot.codex.so/u/…), which the telegram channel sends to as
// Hawk does: such a rule loads as it is, without a warning, as a chat does.
func TestTelegramEndpointsLoadQuietly(t *testing.T) {
	for _, endpoint := range []string{"https://notify.bot.codex.so/u/S3CR3T", "-1001234567", "@alerts", "123456"} {
		r, warnings, err := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, Channels: map[string]ChannelSpec{
			Telegram: {IsEnabled: true, Endpoint: endpoint},
		}})
		if err != nil || len(warnings) != 0 || len(r.Channels) != 1 || r.Channels[0].Endpoint != endpoint {
			t.Errorf("telegram endpoint %q: rule %+v, warnings %q, err %v", endpoint, r, warnings, err)
		}
	}
}

// Messages say what a rule watches, so that whoever gets one knows why.
func TestDescription(t *testing.T) {
	for want, spec := range map[string]Spec{
		"new errors": {WhatToReceive: OnlyNew},
		`new errors, title containing "database" or "redis", not "staging"`: {WhatToReceive: OnlyNew,
			Including: []string{"Database", " redis", ""}, Excluding: []string{"staging"}},
		"100 events in 1 minute":                       {WhatToReceive: SeenMore, Threshold: 100, ThresholdPeriod: 60_000},
		"20 events in 1 hour or 5 events in 3 seconds": {WhatToReceive: SeenMore, Windows: []WindowSpec{{Threshold: 20, Period: 3_600_000}, {Threshold: 5, Period: 3000}}},
		"10 affected users in 90 seconds":              {WhatToReceive: SeenMore, Threshold: 10, ThresholdPeriod: 90_000, CountBy: CountUsers},
		"3 events in 1.5s":                             {WhatToReceive: SeenMore, Threshold: 3, ThresholdPeriod: 1500},
	} {
		spec.ID, spec.IsEnabled = "r", true
		r, _, err := Compile("p", spec)
		if err != nil || r.Description != want {
			t.Errorf("%+v: %q, %v; want %q", spec, r.Description, err, want)
		}
	}
}

// TestExplainAgreesWithMatches: klaxon explain tells operators why a rule
// did or did not match; a reason that disagreed with Matches would send
// them after the wrong cause.
func TestExplainAgreesWithMatches(t *testing.T) {
	mk := func(what string, inc, exc []string) *Rule {
		r, _, err := Compile("p", Spec{ID: "r", IsEnabled: true, WhatToReceive: what, Threshold: 1, ThresholdPeriod: 1000,
			Including: inc, Excluding: exc, Channels: hook()})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cases := []struct {
		rule   *Rule
		title  string
		isNew  bool
		want   bool
		reason string
	}{
		{mk(OnlyNew, nil, nil), "x", false, false, "not new"},
		{mk(OnlyNew, nil, nil), "x", true, true, "no title filter"},
		{mk(SeenMore, []string{"DB"}, []string{"staging"}), "db down on Staging", false, false, `excluding word "staging"`},
		{mk(SeenMore, []string{"DB", "cache"}, nil), "Cache miss", false, true, `including word "cache"`},
		{mk(SeenMore, []string{"db"}, nil), "TypeError", false, false, `none of the including words ["db"]`},
		{mk(SeenMore, nil, []string{"staging"}), "TypeError", false, true, "none of the excluding words"},
	}
	for _, c := range cases {
		got, reason := c.rule.Explain(c.title, c.isNew)
		if got != c.want || got != c.rule.Matches(c.title, c.isNew) || !strings.Contains(reason, c.reason) {
			t.Errorf("Explain(%q, %v) = %v, %q; want %v, %q (Matches %v)", c.title, c.isNew, got, reason, c.want, c.reason, c.rule.Matches(c.title, c.isNew))
		}
	}
}

func TestStormOverChoice(t *testing.T) {
	yes, no := true, false
	seen := func(s *bool, countBy string) Spec {
		return Spec{ID: "r", IsEnabled: true, WhatToReceive: SeenMore, Threshold: 5, ThresholdPeriod: 1000, CountBy: countBy,
			StormOver: s, Channels: hook()}
	}
	for _, c := range []struct {
		name       string
		spec       Spec
		alone, all bool // wanted without and with KLAXON_STORM_OVER
		warning    string
	}{
		{"unsaid", seen(nil, ""), false, true, ""},
		{"on", seen(&yes, ""), true, true, ""},
		{"off", seen(&no, ""), false, false, ""},
		{"users", seen(&yes, CountUsers), false, false, "not supported with countBy users"},
		{"users unsaid", seen(nil, CountUsers), false, false, ""},
		{"only new", Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, StormOver: &yes, Channels: hook()}, false, false, "SEEN_MORE rules only"},
	} {
		r, warnings, err := Compile("p", c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r.WantsStormOver(false) != c.alone || r.WantsStormOver(true) != c.all {
			t.Errorf("%s: wants %t alone, %t with the setting; want %t, %t", c.name, r.WantsStormOver(false), r.WantsStormOver(true), c.alone, c.all)
		}
		if got := strings.Join(warnings, "; "); c.warning == "" && got != "" || !strings.Contains(got, c.warning) {
			t.Errorf("%s: warnings %q, want %q", c.name, got, c.warning)
		}
	}
}
