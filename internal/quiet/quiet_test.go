package quiet

import (
	"strings"
	"testing"
	"time"
)

func mustCompile(t *testing.T, s Spec) *Schedule {
	t.Helper()
	sc, err := Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func berlin(t *testing.T) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// Every error names the field, so that a rules check or a skipped rule's
// warning says what to fix.
func TestCompileErrorsNameTheField(t *testing.T) {
	night := []PeriodSpec{{From: "22:00", To: "07:00"}}
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{Hours: night}, "quiet.timezone is missing"},
		{Spec{Timezone: "Europe/Berln", Hours: night}, `quiet.timezone "Europe/Berln": not a known IANA time zone`},
		{Spec{Timezone: "Local", Hours: night}, `quiet.timezone "Local"`},
		{Spec{Timezone: "UTC"}, "quiet.hours is empty"},
		{Spec{Timezone: "UTC", Hours: make([]PeriodSpec, 17)}, "quiet.hours has 17 periods: at most 16"},
		{Spec{Timezone: "UTC", Hours: []PeriodSpec{{Days: []string{"mon", "fry"}}}}, `quiet.hours[0].days[1] "fry": want a day of the week`},
		{Spec{Timezone: "UTC", Hours: []PeriodSpec{night[0], {From: "25:00"}}}, `quiet.hours[1].from "25:00": want a time of day`},
		{Spec{Timezone: "UTC", Hours: []PeriodSpec{{From: "7:5"}}}, `quiet.hours[0].from "7:5"`},
		{Spec{Timezone: "UTC", Hours: []PeriodSpec{{To: "noon"}}}, `quiet.hours[0].to "noon"`},
		{Spec{Timezone: "UTC", Hours: []PeriodSpec{{From: "24:00"}}}, `quiet.hours[0].from "24:00"`},
		{Spec{Timezone: "UTC", Hours: []PeriodSpec{{From: "22:00", To: "22:00"}}}, "quiet.hours[0]: from and to are both 22:00"},
		{Spec{Timezone: "UTC", Hours: []PeriodSpec{{}}}, "cover the whole week"},
		{Spec{Timezone: "UTC", Hours: []PeriodSpec{{From: "12:00", To: "12:00:01"}, {From: "12:00:01", To: "12:00"}}}, "cover the whole week"},
	} {
		_, err := Compile(c.spec)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%+v) = %v, want an error containing %q", c.spec, err, c.want)
		}
	}
}

// "Every night, and all weekend": a night that runs into the weekend and
// the weekend that runs into Monday's night are one quiet period, with one
// recap on Monday at 07:00. Times are the zone's wall clock.
func TestAtJoinsPeriodsThatTouch(t *testing.T) {
	loc := berlin(t)
	sc := mustCompile(t, Spec{Timezone: "Europe/Berlin", Hours: []PeriodSpec{
		{From: "22:00", To: "07:00"}, {Days: []string{"Sat", "sunday"}}}})
	at := func(d, h, m int) time.Time { return time.Date(2026, 1, d, h, m, 0, 0, loc) } // Jan 5 2026 is a Monday
	for _, c := range []struct {
		t            time.Time
		since, until time.Time // zero: not quiet
	}{
		{at(7, 12, 0), time.Time{}, time.Time{}},     // Wednesday noon
		{at(7, 23, 0), at(7, 22, 0), at(8, 7, 0)},    // Wednesday night
		{at(8, 6, 59), at(7, 22, 0), at(8, 7, 0)},    // Thursday morning
		{at(8, 7, 0), time.Time{}, time.Time{}},      // Thursday 07:00: over
		{at(9, 23, 0), at(9, 22, 0), at(12, 7, 0)},   // Friday night: until Monday
		{at(11, 12, 0), at(9, 22, 0), at(12, 7, 0)},  // Sunday noon
		{at(5, 3, 0), at(2, 22, 0), at(5, 7, 0)},     // Monday 03:00: began the week before
		{at(12, 6, 30), at(9, 22, 0), at(12, 7, 0)},  // Monday morning
		{at(12, 7, 30), time.Time{}, time.Time{}},    // Monday 07:30
		{at(12, 22, 0), at(12, 22, 0), at(13, 7, 0)}, // Monday 22:00: starts
	} {
		sp, ok := sc.At(c.t.UTC())
		if ok != !c.until.IsZero() || ok && (!sp.Since.Equal(c.since) || !sp.Until.Equal(c.until)) {
			t.Errorf("At(%s) = %s–%s %v, want %s–%s", c.t.Format("Mon 15:04"), sp.Since, sp.Until, ok, c.since, c.until)
		}
		if ok && sp.Timezone != "Europe/Berlin" {
			t.Errorf("zone %q", sp.Timezone)
		}
	}
	if got := sc.String(); got != "every day 22:00–07:00, sat sun all day (Europe/Berlin)" {
		t.Errorf("String() = %q", got)
	}
}

// A period from Sunday night into Monday belongs to Sunday, and is found
// from either side of the week's turn.
func TestAtAcrossTheWeeksEnd(t *testing.T) {
	sc := mustCompile(t, Spec{Timezone: "UTC", Hours: []PeriodSpec{{Days: []string{"sun"}, From: "22:00", To: "07:00"}}})
	mon3 := time.Date(2026, 1, 5, 3, 0, 0, 0, time.UTC)
	sp, ok := sc.At(mon3)
	if !ok || !sp.Since.Equal(time.Date(2026, 1, 4, 22, 0, 0, 0, time.UTC)) || !sp.Until.Equal(time.Date(2026, 1, 5, 7, 0, 0, 0, time.UTC)) {
		t.Errorf("At(Monday 03:00) = %+v %v", sp, ok)
	}
	if _, ok := sc.At(time.Date(2026, 1, 5, 22, 30, 0, 0, time.UTC)); ok {
		t.Error("Monday night is quiet; only Sunday's is")
	}
}

// A night across a change of the clocks lasts as the wall clock says:
// 22:00 to 07:00 is 8 hours when the clocks go forward.
func TestAtAcrossAClockChange(t *testing.T) {
	loc := berlin(t)
	sc := mustCompile(t, Spec{Timezone: "Europe/Berlin", Hours: []PeriodSpec{{From: "22:00", To: "07:00"}}})
	sp, ok := sc.At(time.Date(2026, 3, 29, 4, 0, 0, 0, loc))
	if !ok || sp.Until.Sub(sp.Since) != 8*time.Hour || !sp.Until.Equal(time.Date(2026, 3, 29, 7, 0, 0, 0, loc)) {
		t.Errorf("spring night %+v %v, want 8 hours to 07:00", sp, ok)
	}
	sp, ok = sc.At(time.Date(2026, 10, 25, 4, 0, 0, 0, loc))
	if !ok || sp.Until.Sub(sp.Since) != 10*time.Hour {
		t.Errorf("autumn night %+v %v, want 10 hours", sp, ok)
	}
}

// Next is the period under way, or the next to begin, next week's when
// this week's are over; seconds are kept.
func TestNext(t *testing.T) {
	sc := mustCompile(t, Spec{Timezone: "UTC", Hours: []PeriodSpec{
		{Days: []string{"mon", "tue", "wed", "thu", "fri"}, From: "22:00", To: "07:00:30"}}})
	sat := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	sp := sc.Next(sat)
	if !sp.Since.Equal(time.Date(2026, 1, 12, 22, 0, 0, 0, time.UTC)) || !sp.Until.Equal(time.Date(2026, 1, 13, 7, 0, 30, 0, time.UTC)) {
		t.Errorf("Next(Saturday) = %+v, want Monday night", sp)
	}
	wed := time.Date(2026, 1, 7, 23, 0, 0, 0, time.UTC)
	if sp := sc.Next(wed); !sp.Since.Equal(time.Date(2026, 1, 7, 22, 0, 0, 0, time.UTC)) {
		t.Errorf("Next(Wednesday night) = %+v, want the night under way", sp)
	}
	if got := sc.String(); got != "mon tue wed thu fri 22:00–07:00:30 (UTC)" {
		t.Errorf("String() = %q", got)
	}
}
