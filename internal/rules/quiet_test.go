package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/quiet"
)

// A rule's quiet hours hold its firings during them; a critical rule
// passes through, with a warning when it also gives quiet hours, which it
// would never use; malformed ones skip the rule with an error naming the
// field.
func TestCompileQuietHours(t *testing.T) {
	night := &quiet.Spec{Timezone: "UTC", Hours: []quiet.PeriodSpec{{From: "22:00", To: "07:00"}}}
	spec := Spec{ID: "r", IsEnabled: true, WhatToReceive: OnlyNew, Quiet: night,
		Channels: map[string]ChannelSpec{Webhook: {IsEnabled: true, Endpoint: "https://example.com/hook"}}}
	r, _, err := Compile("p", spec)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 7, 23, 0, 0, 0, time.UTC)
	if sp := r.QuietAt(at); sp == nil || !sp.Until.Equal(time.Date(2026, 1, 8, 7, 0, 0, 0, time.UTC)) {
		t.Errorf("QuietAt(23:00) = %+v, want until 07:00", sp)
	}
	if sp := r.QuietAt(at.Add(-12 * time.Hour)); sp != nil {
		t.Errorf("QuietAt(11:00) = %+v, want none", sp)
	}

	spec.Critical = true
	r, warnings, err := Compile("p", spec)
	if err != nil || r.QuietAt(at) != nil || !r.Critical {
		t.Fatalf("critical rule: %+v, %v; want it to pass quiet hours", r, err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "quiet is ignored: the rule is critical") {
		t.Errorf("warnings %q", warnings)
	}

	spec.Critical = false
	spec.Quiet = &quiet.Spec{Timezone: "UTC", Hours: []quiet.PeriodSpec{{From: "07:00", To: "07:00"}}}
	if _, _, err := Compile("p", spec); err == nil || !strings.Contains(err.Error(), "quiet.hours[0]: from and to are both 07:00") {
		t.Errorf("empty period: %v", err)
	}
}
